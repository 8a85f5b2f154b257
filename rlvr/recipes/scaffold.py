"""What every recipe does around its own loop: start a run, restore or save its state, end a step,
end the run. The loop itself stays in the recipe, read top to bottom:

    with Run.start(config, "sft", resume=resume, overwrite=overwrite) as run:   # ranks, run folder, seed, threads
        ... data, models, optimizers (a resumed run loads its models from run.checkpoint) ...
        run.restore(states, models={"policy": model}, tokenizer=tokenizer)      # a checkpoint, or config.yaml
        for step in run.steps(total):                   # progress bar; Ctrl-C ends the step, then checkpoints
            ... the step ...
            run.end_step(step, metrics)                 # metrics.jsonl, progress, plot, checkpoint on schedule
        return run.finish(summary, save_final)          # final model, plot, summary.json (rank 0)

A start that fails (a wrong model path, data file, option or device found while the run is built, a
Ctrl-C during start-up) leaves the run folder as it found it: nothing is written before ``restore``,
and what was written is undone if the run ends before its first step (``rlvr.run.folder.RunFolder``);
``--overwrite`` deletes the run it replaces only once the new one has trained a step.

Interruption: the first SIGINT or SIGTERM lets the step in progress finish, saves a checkpoint and
raises :class:`RunInterrupted` (which says where the checkpoint is and how to resume); a second
SIGINT aborts at once (the message names the last checkpoint written). Under ``torchrun`` every rank
sees the same decision (one collective per step).
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from rlvr.config import save_config
from rlvr.run.checkpoint import latest_checkpoint, resume_checkpoint
from rlvr.run.folder import RunFolder
from rlvr.run.progress import make_progress
from rlvr.run.ranks import join_run, open_tracker, replica_check, restore_run_states, save_run_checkpoint
from rlvr.run.sharding import is_sharded
from rlvr.run.tracking import plot_metrics

#: The command that resumes a run, by the recipe name the run folder was started under.
RESUME_COMMANDS = {"sft": "sft", "rm": "train-rm", "prm": "train-prm", "dpo": "dpo"}


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM: ``what`` happened (which checkpoint holds it) and the command
    that resumes it."""

    def __init__(self, what: str, command: str, *, run_dir: Path, step: int | None, resumable: bool = True):
        super().__init__(what, command)
        self.what, self.command, self.run_dir, self.step, self.resumable = what, command, run_dir, step, resumable

    def __str__(self) -> str:
        return f"{self.what}; {'resume' if self.resumable else 'start it again'} with: {self.command}"


class Run:
    """A run in progress, on one process or one rank of several (see the module docstring)."""

    def __init__(self, config, name: str, folder: RunFolder, dist, checkpoint: Path | None):
        self.config, self.name, self.folder, self.dist, self.checkpoint = config, name, folder, dist, checkpoint
        self.run_dir = folder.path
        self.tracker = None  # metrics.jsonl, opened by restore(): a start that fails before it writes nothing
        self._tracker_closed = False
        self.progress = None
        self.evaluations: dict[int, dict[str, float]] = {}  # step -> eval/ metrics, kept in checkpoints
        self.stopped: str | None = None  # why a run ended before its last step (kept in checkpoints)
        self.log_s = 0.0  # the previous step's logging, plotting and checkpointing time
        self.done = 0  # the last step done: a resumed run's checkpoint step
        self.step_started = 0.0  # when the step in progress began
        self.panels = None  # the plot's panels (None: the RL default)
        self._save: dict[str, Any] = {}
        self._wall_before, self._started = 0.0, time.perf_counter()
        self._total, self._last_saved, self._loop = 0, None, None
        self._signal = _Signals()
        self._cleanups = contextlib.ExitStack()

    # ---- start --------------------------------------------------------------------------------

    @classmethod
    def start(cls, config, name: str, *, resume: bool = False, overwrite: bool = False, check=None):
        """Join the ranks, prepare the run folder (``name`` names a new default one), seed, set threads;
        with ``resume`` find the checkpoint to continue from (``run.checkpoint``)."""
        config, folder, dist = join_run(config, name, resume=resume, overwrite=overwrite, check=check)
        return cls(config, name, folder, dist, resume_checkpoint(folder.path) if resume else None)

    def restore(self, states: dict[str, Any], *, models: dict[str, Any], tokenizer, sampler=None,
                extra: Callable[[], dict[str, Any]] | None = None) -> int:
        """Say what a checkpoint holds (``states``: objects with ``state_dict``; ``models``: saved as model
        folders; ``sampler``: the per-rank data position; ``extra()``: more plain values) and load it
        back when resuming. The run is built by now, so this is where it begins to write its folder:
        ``config.yaml`` (a resumed run's too, with the overrides given to ``--resume``, so that a later
        plain ``--resume`` continues with them) and ``metrics.jsonl``. Returns the last step done
        (``run.done``; 0 for a new run)."""
        self._save = dict(states=states, models=models, tokenizer=tokenizer, sampler=sampler, extra=extra)
        self.folder.begin()
        self.tracker = open_tracker(self.config, self.run_dir, self.dist)
        if self.dist.is_main:
            save_config(self.config, self.run_dir / "config.yaml")
        if self.checkpoint is None:
            return 0
        state = restore_run_states(self.checkpoint, states, self.dist, sampler, seed=self.config.train.seed,
                                   models=models)
        self.tracker.truncate(state["step"])
        self._wall_before = state.get("wall_s", 0.0)
        self.evaluations = {int(k): v for k, v in state.get("evaluations", {}).items()}
        self.stopped = state.get("stopped")
        self.done = self._last_saved = state["step"]
        return self.done

    # ---- the loop -----------------------------------------------------------------------------

    def steps(self, total: int, *, until: str | None = None) -> Iterator[int]:
        """The steps after the last one done up to ``total``, with a progress bar (rank 0) and Ctrl-C
        handling; none when the run had already stopped (an early stop saved in the checkpoint). ``until``
        names a stop rule that may end the run sooner (its progress then gives the cap's time as a bound)."""
        self._total = total
        if self.checkpoint is not None and self.dist.is_main:
            print(f"resuming from step {self.done} of {total} ({self.checkpoint})", flush=True)
        self.progress = make_progress(total, self.name, initial=self.done, until=until,
                                      enabled=self.config.log.progress and self.dist.is_main)
        self._loop = self._loop_steps(self.done + 1, total)
        return self._loop

    def _loop_steps(self, first: int, total: int) -> Iterator[int]:
        if self.stopped:
            return
        with self._signal.installed(self.write):
            for step in range(first, total + 1):
                self.step_started = time.perf_counter()
                yield step
                if self.stopped:
                    return

    def stop(self, reason: str) -> None:
        """End the run after this step (its checkpoint says why, so a resume ends at once too)."""
        self.stopped = self.stopped or reason

    def write(self, message: str) -> None:
        """Print a line without breaking the progress bar."""
        (self.progress.write if self.progress is not None else print)(message)

    def end_step(self, step: int, metrics: dict[str, float], *, postfix: dict[str, str] | None = None) -> None:
        """Log ``metrics``, move the progress bar, redraw the plot and save a checkpoint when due: every
        ``checkpoint.every`` steps, after the last step (or the step the run :meth:`stop` ped at), and
        when the run was interrupted, which then raises :class:`RunInterrupted`."""
        log_start = time.perf_counter()
        self.folder.keep()  # a step is done: the run is this folder's now (--overwrite: the old one goes)
        self.tracker.log(step, metrics)
        if self.progress is not None:
            self.progress.set_postfix(**(postfix or {}))
            self.progress.update(1)
        log, ckpt = self.config.log, self.config.checkpoint
        if log.plot and log.plot_every and step % log.plot_every == 0 and self.dist.is_main:
            self.plot()
        interrupted = self._signal.agreed(self.dist)
        periodic = ckpt.every and step % ckpt.every == 0
        final = (step == self._total or self.stopped) and ckpt.at_end
        if periodic or final or interrupted:
            self.save_checkpoint(step)
        self.log_s = time.perf_counter() - log_start
        if interrupted:
            raise RunInterrupted(f"interrupted after step {step}: checkpoint "
                                 f"{self.run_dir / 'checkpoints' / f'step_{step:06d}'} saved", self._resume_command(),
                                 run_dir=self.run_dir, step=step)

    def save_checkpoint(self, step: int) -> None:
        """Every rank's state gathered, written by rank 0 (a collective: every rank calls it)."""
        s = self._save
        extra = {"wall_s": self.wall_s(), "evaluations": self.evaluations, "stopped": self.stopped,
                 **(s["extra"]() if s.get("extra") else {})}
        save_run_checkpoint(self.run_dir, step, dist=self.dist, sampler=s.get("sampler"), models=s["models"],
                            tokenizer=s["tokenizer"], states=s["states"], keep=self.config.checkpoint.keep, extra=extra)
        self._last_saved = step

    def wall_s(self) -> float:
        """Seconds this run has trained, over every resumed part."""
        return self._wall_before + time.perf_counter() - self._started

    # ---- the end ------------------------------------------------------------------------------

    def finish(self, summary: dict[str, Any], *, save_final: Callable[[Path], Any] | None = None,
               models: tuple = ()) -> dict[str, Any]:
        """Close the progress bar and the metrics, check that the ranks' ``models`` agree, and on rank 0
        call ``save_final(run_dir / "final")`` (unless ``checkpoint.final_model`` is off; every rank calls it
        when ``models`` are sharded, to gather them), draw the plot
        and write ``summary.json``: ``summary`` plus the wall time, the reason of an early stop and the
        replicas' digests. Returns it."""
        self._close_progress()
        self.folder.keep()  # a run of no step (train.steps: 0) ends here
        sharded = any(is_sharded(model) for model in models)
        replicas = {} if sharded else replica_check(self.dist, *models)  # a shard is no replica
        self._close_tracker()
        summary = {**summary, "wall_s": self.wall_s(), **({"stopped": self.stopped} if self.stopped else {}),
                   **({"replicas": replicas} if replicas else {})}
        save = save_final is not None and self.config.checkpoint.final_model
        if save and sharded:  # every rank takes part in gathering the whole model; rank 0 writes it
            save_final(self.run_dir / "final")
        if not self.dist.is_main:
            return {**summary, "rank": self.dist.rank}
        if save and not sharded:
            save_final(self.run_dir / "final")
        if self.config.log.plot:
            self.plot()
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def plot(self) -> None:
        kwargs = {"panels": self.panels} if self.panels is not None else {}
        plot_metrics(self.tracker.path, self.run_dir / "metrics.png", title=f"{self.name} {self.run_dir}", **kwargs)

    def cleanup(self, close: Callable[[], Any]) -> None:
        """Call ``close`` when the run ends, however it ends (verifier workers, an engine), last first."""
        self._cleanups.callback(close)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if self._loop is not None:
            self._loop.close()  # the signal handlers go back to what they were
        self._close_progress()
        self._close_tracker()  # metrics.jsonl is flushed every line; this closes its file on any ending
        self._cleanups.close()
        if kind is not None and self.folder.state != "kept":  # ended before its first step: undo the start
            self.folder.abandon()
            if issubclass(kind, KeyboardInterrupt) and not self.folder.resume:
                raise RunInterrupted(f"aborted during start-up, before the first step: {self.run_dir} is as it was "
                                     "before the start", "the same command", run_dir=self.run_dir, step=None,
                                     resumable=False) from None
        if kind is not None and issubclass(kind, KeyboardInterrupt) and not isinstance(error, RunInterrupted):
            found = latest_checkpoint(self.run_dir)
            what = f"aborted; the last checkpoint is {found}" if found else f"aborted before {self.run_dir} held a checkpoint"
            raise RunInterrupted(what, self._resume_command() if found else self._restart_command(),
                                 run_dir=self.run_dir, step=self._last_saved, resumable=found is not None) from None

    def _close_tracker(self) -> None:
        if not self._tracker_closed and self.tracker is not None:
            self._tracker_closed = True
            self.tracker.close()

    def _close_progress(self) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None

    def _resume_command(self) -> str:
        return f"rlvr {RESUME_COMMANDS.get(self.name, 'train')} --resume {self.run_dir}"

    def _restart_command(self) -> str:
        return f"rlvr {RESUME_COMMANDS.get(self.name, 'train')} {self.run_dir / 'config.yaml'} --overwrite"


class _Signals:
    """SIGINT / SIGTERM while a loop runs: the first asks the run to stop after its current step, a
    second SIGINT aborts at once (KeyboardInterrupt). Only the main thread can take signals; a loop
    run from another thread keeps Python's defaults. A signal the process inherited ignored stays
    ignored: a non-interactive shell starts its background jobs (``cmd &``) with SIGINT ignored, so a
    Ctrl-C meant for the foreground program must not stop them (Python itself keeps it ignored too)."""

    def __init__(self):
        self.requested = False

    @contextlib.contextmanager
    def installed(self, say: Callable[[str], None]) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: handler for sig in (signal.SIGINT, signal.SIGTERM)
                    if (handler := signal.getsignal(sig)) is not signal.SIG_IGN}

        def ask(signum, frame):
            if self.requested and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.requested = True
            say(f"{signal.Signals(signum).name}: finishing this step, then saving a checkpoint "
                "(Ctrl-C again aborts at once)")

        for sig in previous:
            signal.signal(sig, ask)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def agreed(self, dist) -> bool:
        """Whether any rank was asked to stop (the same answer on every rank)."""
        if dist.world_size == 1:
            return self.requested
        return dist.sum(float(self.requested)) > 0

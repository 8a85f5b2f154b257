"""The HF engine in a process of its own: generation that can run while the trainer updates.

    engine = ProcessEngine(path, tokenizer, dtype="float32", threads=1)
    engine.update_weights(iter_inference_weights(policy))    # publication 1: a copy goes to the worker
    ticket = engine.submit(prompts, n, sampling, seed=7)       # returns at once
    ...                                                        # the trainer updates meanwhile
    groups, info = engine.result(ticket)                       # info: the publication that sampled them

The worker (a spawned process) holds its own copy of the model and an :class:`~rlvr.engines.hf.HFEngine`
over it, and serves one FIFO queue of requests: weight publications and generations, in the order they
were sent, so a generation submitted after publication ``v`` is sampled by exactly publication ``v``
(which makes an asynchronous run as reproducible as a synchronous one). ``generate`` (the
:class:`~rlvr.engines.base.Engine` protocol) is a submit and a wait that hands the trainer's torch RNG
state to the worker and takes back the state after sampling, so a run that waits for each generation
draws exactly the samples the in-process HF engine would.

The worker runs on ``device`` (the trainer's, or a GPU of its own), in ``dtype``. Publications travel as
CPU copies and are copied onto it there; on a CUDA device, ``generate`` hands over that device's RNG
state too (the trainer's own device's stream, ``rng_device``), as the in-process engine would draw from it.

The worker ignores SIGINT and SIGTERM: a Ctrl-C (sent to the terminal's whole process group) or a
scheduler's SIGTERM is the trainer's to act on, and the trainer still needs the worker to finish its
step and drain the queue into a checkpoint; the trainer then closes the worker (``close``), and a worker
whose trainer died without closing it notices within a second and exits.

Every wait has a deadline (``timeout_s``): a worker that hangs (a weight publication that never lands,
a deadlock) ends the run with :class:`GeneratorTimeout`, naming the deadline, instead of stalling it.
A wait polls in slices of :data:`POLL_S` and checks that the worker lives, so a worker that died (killed
by the OOM killer, say) stops the run at once with :class:`GeneratorError` naming its signal or exit
code. A worker that raises sends its traceback back, re-raised in the trainer as :class:`GeneratorError`.
"""

from __future__ import annotations

import atexit
import os
import queue
import signal
import time
import traceback
from typing import Any, Iterable, Sequence

import torch

from rlvr.engines.base import Completion, SamplingParams, eos_token_ids
from rlvr.verifiers.errors import UserError


#: Seconds between two checks that the worker lives while the trainer waits for it.
POLL_S = 0.25


class GeneratorTimeout(UserError, TimeoutError):
    """The generator process did not answer within its deadline."""


class GeneratorError(RuntimeError):
    """The generator process failed; the message holds its traceback."""


class ProcessEngine:
    """An HF engine in a worker process (module docstring); ``weight_sync = "merged"``.

    Args:
        path: the model folder the worker loads (its architecture; the weights come from publications).
        tokenizer: the model's tokenizer (pad and eos ids).
        dtype: the worker's weights dtype.
        device: where the worker holds the model and generates (``cpu``, ``cuda``, ``cuda:N``).
        rng_device: the trainer's device, whose RNG stream ``generate`` continues on the worker.
        threads: torch threads of the worker.
        max_batch_size: sequences generated together.
        timeout_s: the longest wait for the worker to start or to answer a request.
        episodes: to play multi-turn episodes in the worker (``submit(..., problems=...)``): the trainer's
            :class:`~rlvr.rollout.episodes.EpisodeRunner` settings, ``{"environments", "default",
            "max_turns", "max_episode_tokens", "workers", "messages", "eos_ids"}`` and optionally
            ``"step_timeout_s"`` (the environments
            are pickled, so their classes must be importable).
    """

    weight_sync = "merged"

    def __init__(self, path: str, tokenizer, *, dtype: str = "float32", device: str = "cpu", rng_device: str = "cpu",
                 threads: int = 1, max_batch_size: int = 256, timeout_s: float = 300.0,
                 episodes: dict[str, Any] | None = None):
        import torch.multiprocessing as mp

        self.timeout_s, self.dtype = timeout_s, dtype
        self.device, self.rng_device = torch.device(device), torch.device(rng_device)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        # spawn, not fork: a fork would copy the trainer's threads and locks, and CUDA cannot start in one
        context = mp.get_context("spawn")
        self._requests, self._replies = context.Queue(), context.Queue()
        spec = {"path": str(path), "dtype": dtype, "device": str(self.device), "threads": threads,
                "max_batch_size": max_batch_size, "episodes": episodes}
        self._process = context.Process(target=_serve, args=(spec, self._requests, self._replies), daemon=True,
                                        name="rlvr-generator")
        self._process.start()
        # before multiprocessing's own exit hook (atexit runs the last registered first), which would send
        # the worker a SIGTERM it ignores and then wait for it forever
        atexit.register(self.close)
        self.publications = 0  # weight publications sent; the worker serves them in order
        self._next_ticket = 0
        self._done: dict[int, tuple[list[list[Completion]], dict[str, Any]]] = {}
        self._wait(-1, "start (load the model)")
        self.loaded: dict[str, str] = self._done.pop(-1)  # where the worker's model is: {"device", "dtype"}

    # ---- the Engine protocol ----------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Publish the weights: copied now (the trainer goes on changing its own), sent to the worker,
        which takes them before any request sent after this call."""
        weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in named_tensors}
        self.publications += 1
        self._send("weights", None, {"weights": weights, "publication": self.publications})

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        """Generate and wait, continuing the trainer's torch RNG stream (see the module docstring)."""
        ticket = self.submit(prompts, n, sampling, rng=self.rng_state())
        groups, info = self.result(ticket)
        self.set_rng_state(info["rng"])
        return groups

    def rng_state(self) -> dict[str, bytes]:
        """The trainer's RNG state that in-process sampling would draw from, for ``submit(rng=...)``."""
        return _rng_state(self.rng_device)

    def set_rng_state(self, state: dict[str, bytes]) -> None:
        """Continue the trainer's RNG stream from where the worker left it (``info["rng"]``)."""
        _set_rng_state(state, self.rng_device)

    # ---- asynchronous use -------------------------------------------------------------------

    def submit(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams, *,
               rng: dict[str, bytes] | None = None, seed: int | None = None,
               problems: Sequence[Any] | None = None, templates: Sequence[Any] | None = None) -> int:
        """Queue a generation (sampled with RNG state ``rng``, from :meth:`rng_state`, or seeded with
        ``seed``); returns its ticket at once. With ``problems`` (and the chat ``templates`` their
        prompts are rendered with), the worker plays them as multi-turn episodes."""
        ticket = self._next_ticket
        self._next_ticket += 1
        self._send("generate", ticket, {"prompts": [list(p) for p in prompts], "n": n, "sampling": sampling,
                                        "rng": rng, "seed": seed, "problems": problems, "templates": templates})
        return ticket

    def result(self, ticket: int) -> tuple[list[list[Completion]], dict[str, Any]]:
        """The groups of ``ticket`` and ``info``: ``publication`` (the weights that sampled them),
        ``seconds`` (the worker's generation time), ``idle_s`` (how long the worker waited for this
        request), ``rng`` (its RNG state after sampling)."""
        if ticket not in self._done:
            self._wait(ticket, f"generation {ticket} (after weight publication {self.publications})")
        return self._done.pop(ticket)

    def close(self) -> None:
        atexit.unregister(self.close)
        if self._process.is_alive():
            try:
                self._requests.put(("stop", None, None))
                self._process.join(timeout=10)
            finally:
                if self._process.is_alive():
                    self._process.kill()
                    self._process.join(timeout=10)

    # ---- plumbing -----------------------------------------------------------------------------

    def _send(self, kind: str, ticket: int | None, payload: Any) -> None:
        if not self._process.is_alive():
            raise GeneratorError(f"the generator process {self._ended()}; the run cannot go on without it")
        self._requests.put((kind, ticket, payload))

    def _wait(self, ticket: int, what: str) -> None:
        """Take replies until ``ticket``'s has come, within ``timeout_s``, checking every :data:`POLL_S` that
        the worker still lives (a dead one never answers: waiting for the deadline would only stall)."""
        deadline = time.monotonic() + self.timeout_s
        while ticket not in self._done:
            remaining = deadline - time.monotonic()
            try:
                kind, got, payload = self._replies.get(timeout=min(max(remaining, 0.0), POLL_S))
            except (OSError, EOFError) as exc:  # a reply that cannot be read: its writer is gone
                self._process.join(timeout=1.0)
                how = "is alive" if self._process.is_alive() else self._ended()
                raise GeneratorError(f"the trainer could not read the generator process's answer to {what} ({exc!r}); "
                                     f"the process {how}; the run cannot go on without it") from exc
            except queue.Empty:
                if not self._process.is_alive():
                    raise GeneratorError(f"the generator process {self._ended()} before it answered {what}; the run "
                                         "cannot go on without it") from None
                if remaining <= 0:
                    raise GeneratorTimeout(
                        f"the generator process did not answer {what} within {self.timeout_s:g} s "
                        "(async_generation.timeout_s): it is hung or far too slow; stopping") from None
                continue
            if kind == "error":
                raise GeneratorError(f"the generator process failed:\n{payload}")
            self._done[got] = payload

    def _ended(self) -> str:
        """How the worker ended, for an error message: its signal (SIGKILL is most often the OOM killer's)
        or its exit code."""
        code = self._process.exitcode
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            hint = " (the kernel's out-of-memory killer sends it too)" if name == "SIGKILL" else ""
            return f"was killed by {name}{hint}"
        return f"exited with code {code}"


def _serve(spec: dict[str, Any], requests, replies) -> None:
    """The worker's loop (module docstring): weights and generations, in order, until ``stop``."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # the trainer's to act on: it stops, drains us, then closes us
        signal.signal(sig, signal.SIG_IGN)
    device = torch.device(spec["device"])
    try:
        torch.set_num_threads(spec["threads"])
        if device.type == "cuda":
            device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
            torch.cuda.set_device(device)  # allocations and the RNG state of "cuda" mean this device
        from rlvr.engines.hf import HFEngine
        from rlvr.modeling.loading import load_policy, load_tokenizer

        model = load_policy(spec["path"], dtype=spec["dtype"], device=str(device)).eval()
        tokenizer = load_tokenizer(spec["path"])
        eos_token_ids(model, tokenizer)  # a model without EOS fails here, in the worker's own words
        engine = HFEngine(model, tokenizer, max_batch_size=spec["max_batch_size"], weight_sync="merged")
        episodes = _EpisodePlayer(spec["episodes"], tokenizer) if spec["episodes"] else None
    except BaseException:
        replies.put(("error", -1, traceback.format_exc()))
        return
    first = next(model.parameters())
    replies.put(("ready", -1, {"device": str(first.device), "dtype": str(first.dtype).removeprefix("torch.")}))
    publication, parent, free_since = 0, os.getppid(), time.perf_counter()
    while True:
        try:
            kind, ticket, payload = requests.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the trainer died without closing us (SIGKILL): nobody is listening
                return
            continue
        idle = time.perf_counter() - free_since
        try:
            if kind == "stop":
                return
            if kind == "weights":
                engine.update_weights(payload["weights"].items())
                publication = payload["publication"]
            else:
                if payload["rng"] is not None:
                    _set_rng_state(payload["rng"], device)
                elif payload["seed"] is not None:
                    torch.manual_seed(payload["seed"])
                start = time.perf_counter()
                if payload["problems"] is not None:
                    groups = episodes.play(engine, payload)
                else:
                    groups = engine.generate(payload["prompts"], payload["n"], payload["sampling"])
                replies.put(("groups", ticket, (groups, {"publication": publication, "idle_s": idle,
                                                         "seconds": time.perf_counter() - start,
                                                         "rng": _rng_state(device)})))
        except BaseException:
            replies.put(("error", ticket, traceback.format_exc()))
            return
        free_since = time.perf_counter()


def _rng_state(device: torch.device) -> dict[str, bytes]:
    """The RNG state sampling on ``device`` draws from: the CPU's, and a CUDA device's own generator
    (the HF engine's uniform numbers are drawn on the logits' device). As bytes, not tensors: a tensor
    crosses the queue as a file descriptor its reader fetches from the sender, so a reply holding one
    could not be read once the worker died, and would block while it is stopped."""
    state = {"cpu": torch.get_rng_state().numpy().tobytes()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device).numpy().tobytes()
    return state


def _set_rng_state(state: dict[str, bytes], device: torch.device) -> None:
    """Set :func:`_rng_state`'s ``state`` on ``device`` (a CPU trainer's state leaves a CUDA generator as it is)."""
    torch.set_rng_state(torch.frombuffer(bytearray(state["cpu"]), dtype=torch.uint8))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(torch.frombuffer(bytearray(state["cuda"]), dtype=torch.uint8), device)


class _EpisodePlayer:
    """The worker's :class:`~rlvr.rollout.episodes.EpisodeRunner`, built from the trainer's settings;
    environment messages are encoded for the chat template each request names per problem."""

    def __init__(self, settings: dict[str, Any], tokenizer):
        from rlvr.rollout.env_tokens import MessageEncoders
        from rlvr.rollout.episodes import DEFAULT_STEP_TIMEOUT_S, EpisodeRunner

        encoders = MessageEncoders(tokenizer, settings["messages"], settings["eos_ids"])
        self._templates: dict[tuple[str, str], Any] = {}  # problem.key -> its chat template, per request

        def messages_of(problem):
            return encoders(self._templates[problem.key])

        self.runner = EpisodeRunner(messages_of, settings["environments"], default=settings["default"],
                                    max_turns=settings["max_turns"], max_episode_tokens=settings["max_episode_tokens"],
                                    workers=settings["workers"],
                                    step_timeout_s=settings.get("step_timeout_s", DEFAULT_STEP_TIMEOUT_S))

    def play(self, engine, payload: dict[str, Any]) -> list[list[Completion]]:
        self._templates = {p.key: t for p, t in zip(payload["problems"], payload["templates"])}
        return self.runner.generate(engine, payload["problems"], payload["prompts"], payload["n"], payload["sampling"])

"""Metrics out of the loop: ``metrics.jsonl``, plots, optional tensorboard/wandb (alarms: ``alarms.py``).

Metric names are namespaced: ``reward/``, ``verify/``, ``train/``, ``response/``, ``sync/``,
``time/``, ``perf/``, ``rollout/``, ``eval/``.
"""

from __future__ import annotations

import errno
import json
import math
import time
from pathlib import Path
from typing import Any

from rlvr.verifiers.errors import PluginLoadError
from rlvr.verifiers.files import DiskFullError

PLOT_PANELS = [
    ("reward", ["reward/mean"]),
    ("accuracy", ["reward/accuracy", "gold/accuracy", "eval/accuracy"]),
    ("KL to reference", ["train/kl_ref"]),
    ("entropy", ["train/entropy"]),
    ("response length", ["response/length_mean", "response/length_max"]),
    ("clip fraction", ["train/clip_frac_low", "train/clip_frac_high"]),
]
#: Drawn after the others when a run logged their metrics: (title, left-axis keys, right-axis keys).
OPTIONAL_PANELS = [
    ("gold (verifier) vs proxy (reward model)", ["gold/mean", "gold/accuracy"], ["proxy/reward"]),
    ("episodes: tool use and stop reasons", ["env/turns", "env/tool_calls", "env/tool_error_rate", "env/stop_eos",
                                             "env/stop_max_tokens", "env/stop_max_turns"]),
    ("process reward model: steps", ["prm/step_score", "prm/aggregate", "prm/wrong_step_frac"], ["prm/steps"]),
]

#: Keys of every ``metrics.jsonl`` line that label it rather than measure: not sent to trackers.
RECORD_LABELS = ("step", "time")


class Tracker:
    """Appends one JSON line per logged step and forwards to tensorboard/wandb when asked for.

    The file is flushed every step, so nothing logged is lost on a crash. ``truncate(step)`` drops
    lines after a checkpoint's step before a resumed run continues. A tracker asked for without its
    package is a one-line :class:`PluginLoadError` naming the extra to install (the config's ``log``
    section refuses it at load already), never a warning and a run without the tracking it asked for.
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = False, wandb: bool = False,
                 wandb_project: str = "rlvr", wandb_entity: str | None = None, wandb_name: str | None = None,
                 config: dict | None = None, filename: str = "metrics.jsonl"):
        from rlvr.config.sections import tracker_missing

        for flag, wanted in (("tensorboard", tensorboard), ("wandb", wandb)):
            problem = wanted and tracker_missing(flag)
            if problem:  # before anything is written
                raise PluginLoadError(f"log.{flag}: {problem}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / filename
        self._file = self.path.open("a")
        self._tb = self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        if wandb:
            import wandb as wandb_module

            self._wandb = wandb_module.init(project=wandb_project, entity=wandb_entity,
                                            name=wandb_name or self.run_dir.resolve().name, dir=str(self.run_dir),
                                            config=config or {})

    @classmethod
    def for_run(cls, run_dir: str | Path, config) -> "Tracker":
        """The tracker a run config's ``log`` section asks for (tensorboard, wandb: its project, entity and
        run name), the resolved config attached to the wandb run."""
        log = config.log
        return cls(run_dir, tensorboard=log.tensorboard, wandb=log.wandb, wandb_project=log.wandb_project,
                   wandb_entity=log.wandb_entity, wandb_name=log.wandb_name, config=config.model_dump(mode="json"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append ``{"step", "time", **metrics}``: ``time`` is the wall clock when the line was written
        (unix seconds), a label like ``step`` rather than a metric (trackers and plots skip it)."""
        record = {"step": step, "time": round(time.time(), 3), **{k: _jsonable(v) for k, v in metrics.items()}}
        try:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise DiskFullError(f"disk full while writing {self.path}; free some space and continue with "
                                    f"--resume {self.run_dir}") from exc
            raise
        numeric = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k not in RECORD_LABELS}
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def truncate(self, step: int) -> None:
        """Keep only records up to ``step`` (inclusive): the state a checkpoint was saved in."""
        self._file.close()
        kept = [line for line in read_metrics(self.path) if line.get("step", 0) <= step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        tmp.replace(self.path)
        self._file = self.path.open("a")

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``metrics.jsonl`` (a torn last line from a crash is skipped)."""
    records = []
    path = Path(path)
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def plot_metrics(metrics_path: str | Path, out_png: str | Path, title: str = "",
                 panels: list[tuple[str, list[str]]] | None = None) -> Path | None:
    """Draw ``panels`` (``(title, metric keys[, right-axis keys])``; default: reward, accuracy, KL,
    entropy, length, clipping) per step to a PNG, three panels to a row; :data:`OPTIONAL_PANELS`
    follow when the run logged their metrics (gold vs proxy: a reward model's run; tool use and stop
    reasons: a run of multi-turn episodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    if not records:
        return None
    logged = {key for r in records for key in r}
    panels = list(panels or PLOT_PANELS) + [p for p in OPTIONAL_PANELS if logged & {k for keys in p[1:] for k in keys}]
    rows = math.ceil(len(panels) / 3)
    fig, axes = plt.subplots(rows, 3, figsize=(14, 3.5 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (name, keys, *right) in zip(axes.flat, panels):
        drawn = _draw(ax, records, keys)
        if right:  # a second scale: the proxy's units are not the gold's
            twin = ax.twinx()
            colors = iter(["tab:red", "tab:purple", "tab:brown"])
            drawn_right = _draw(twin, records, right[0], colors)
            if drawn_right:
                twin.legend(fontsize=7, loc="lower right")
            drawn = drawn or drawn_right
        ax.set_title(name)
        ax.set_xlabel("step")
        if drawn and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left" if right else "best")
        else:
            ax.text(0.5, 0.5, "not measured\n(e.g. beta = 0: no reference)" if "KL" in name else "not measured",
                    ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    tmp = out_png.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    tmp.replace(out_png)
    return out_png


def _draw(ax, records: list[dict], keys: list[str], colors=None) -> bool:
    """Plot each of ``keys`` that has values; whether anything was drawn."""
    drawn = False
    for key in keys:
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        if points:
            xs, ys = zip(*points)
            style = "o-" if key.startswith("eval/") else "-"
            ax.plot(xs, ys, style, label=key, linewidth=1, markersize=4,
                    **({"color": next(colors)} if colors is not None else {}))
            drawn = True
    return drawn

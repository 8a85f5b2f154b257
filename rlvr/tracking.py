"""Metrics out of the loop: ``metrics.jsonl``, plots, optional tensorboard/wandb, and alarms.

Metric names are namespaced: ``reward/``, ``verify/``, ``train/``, ``response/``, ``sync/``,
``time/``, ``perf/``, ``rollout/``, ``eval/``.
"""

from __future__ import annotations

import errno
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

from rlvr.verifiers.errors import UserError
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
]

#: Keys of every ``metrics.jsonl`` line that label it rather than measure: not sent to trackers.
RECORD_LABELS = ("step", "time")


class Tracker:
    """Appends one JSON line per logged step and forwards to tensorboard/wandb when asked for.

    The file is flushed every step, so nothing logged is lost on a crash. ``truncate(step)`` drops
    lines after a checkpoint's step before a resumed run continues.
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = False, wandb: bool = False,
                 wandb_project: str = "rlvr", config: dict | None = None, filename: str = "metrics.jsonl"):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / filename
        self._file = self.path.open("a")
        self._tb = self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
            except ImportError:
                warnings.warn("log.tensorboard is set but tensorboard is not installed (pip install tensorboard)")
        if wandb:
            try:
                import wandb as wandb_module

                self._wandb = wandb_module.init(project=wandb_project, dir=str(self.run_dir), config=config or {})
            except ImportError:
                warnings.warn("log.wandb is set but wandb is not installed (pip install wandb)")


    @classmethod
    def for_run(cls, run_dir: str | Path, config) -> "Tracker":
        """The tracker a run config's ``log`` section asks for (tensorboard, wandb), the resolved config
        attached to the wandb run."""
        return cls(run_dir, tensorboard=config.log.tensorboard, wandb=config.log.wandb,
                   wandb_project=config.log.wandb_project, config=config.model_dump(mode="json"))
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
    follow when the run logged their metrics (gold vs proxy: a reward model's run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    if not records:
        return None
    logged = {key for r in records for key in r}
    panels = list(panels or PLOT_PANELS) + [p for p in OPTIONAL_PANELS if logged & {*p[1], *p[2]}]
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


def diverging(proxy: list[float], gold: list[float], z: float = 2.0, min_drop: float = 0.01) -> bool:
    """Whether the proxy reward rose while the gold fell, each beyond noise, over a window of steps.

    The window is cut in halves (earlier a, later b); for each series the change of the half means
    must exceed ``z`` standard errors of that difference,

        d = mean(b) - mean(a),   se = sqrt(var(a) / n_a + var(b) / n_b),
        fires when  d_proxy > z * se_proxy  and  d_gold < -max(z * se_gold, min_drop)

    so step-to-step noise (a rising proxy beside a flat, noisy gold) does not fire it, and a gold that
    moves by less than ``min_drop`` does not either (an over-optimised policy loses much more).
    """
    if len(proxy) != len(gold) or len(proxy) < 4:
        return False
    half = len(proxy) // 2

    def change(values: list[float]) -> tuple[float, float]:
        a, b = values[:half], values[len(values) - half:]
        var = lambda xs: sum((x - sum(xs) / len(xs)) ** 2 for x in xs) / (len(xs) - 1)  # noqa: E731
        return sum(b) / len(b) - sum(a) / len(a), math.sqrt(var(a) / len(a) + var(b) / len(b))

    d_proxy, se_proxy = change(proxy)
    d_gold, se_gold = change(gold)
    return d_proxy > z * se_proxy and d_proxy > 0 and d_gold < -max(z * se_gold, min_drop)


class Alarms:
    """Warns when training is silently not learning, after ``patience`` consecutive bad steps.

    Conditions (fractions of this step's groups or completions):
      zero_variance   >= 90% of groups have the same score for every sample (no signal; the spread
                      of the scores, so a continuous reward never counts as all-wrong)
      truncation      >= 50% of completions hit max_new_tokens
      no_extraction   >= 90% of completions had no answer the verifier could extract

    and, with a reward model, ``gold_vs_proxy``: over the last ``window`` steps the proxy reward
    (``proxy/reward``) rose while the gold (``gold/mean``, the verifier's) fell, beyond noise
    (:func:`diverging`); it fires once per stretch of such steps.
    """

    THRESHOLDS = {
        "zero_variance": ("rollout/zero_variance_frac", 0.9,
                          "almost every group's samples score the same (all right or all wrong, for a binary reward): "
                          "no learning signal (make the task easier/harder, raise group_size)"),
        "truncation": ("response/truncation_rate", 0.5,
                       "most completions are cut off at max_new_tokens (raise generation.max_new_tokens)"),
        "no_extraction": ("verify/no_answer_frac", 0.9,
                          "the verifier finds no answer in almost every completion (check the prompt's answer format)"),
    }

    def __init__(self, patience: int = 5, window: int = 20):
        self.patience = patience
        self.window = window
        self.streak = {name: 0 for name in self.THRESHOLDS}
        self.fired: list[tuple[int, str]] = []
        self.history: list[tuple[float, float]] = []  # (proxy, gold) of the last `window` steps
        self.diverging = False

    def update(self, step: int, metrics: dict[str, Any]) -> list[str]:
        """New alarm messages for this step (each fires once per streak)."""
        messages = []
        for name, (key, threshold, advice) in self.THRESHOLDS.items():
            value = metrics.get(key)
            if isinstance(value, (int, float)) and value >= threshold:
                self.streak[name] += 1
                if self.streak[name] == self.patience:
                    message = f"ALARM {name} at step {step}: {key}={value:.2f} for {self.patience} steps; {advice}"
                    messages.append(message)
                    self.fired.append((step, name))
            else:
                self.streak[name] = 0
        proxy, gold = metrics.get("proxy/reward"), metrics.get("gold/mean")
        if isinstance(proxy, (int, float)) and isinstance(gold, (int, float)):
            self.history = [*self.history, (float(proxy), float(gold))][-self.window:]
            now = len(self.history) == self.window and diverging(*map(list, zip(*self.history)))
            if now and not self.diverging:
                messages.append(f"ALARM gold_vs_proxy at step {step}: over the last {self.window} steps the reward "
                                "model's score (proxy/reward) rose while the verifier's (gold/mean) fell: the policy "
                                "is over-optimising the reward model (stop here, use an earlier checkpoint, raise "
                                "algorithm.beta, or try reward_model.ensemble: min over several models)")
                self.fired.append((step, "gold_vs_proxy"))
            self.diverging = now
        return messages

    def state_dict(self) -> dict[str, Any]:
        return {"streak": dict(self.streak), "fired": list(self.fired), "history": list(self.history),
                "diverging": self.diverging}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak.update(state["streak"])
        self.fired = [tuple(x) for x in state["fired"]]
        self.history = [tuple(x) for x in state.get("history", [])]
        self.diverging = state.get("diverging", False)


class VerifierFailure(UserError):
    """Too many of a step's samples could not be verified: training on what is left would learn from
    a broken reward (masked or zero-scored samples), so the run stops."""


class VerifierErrors:
    """Watches verifier errors: prints the first traceback of the run once, and stops the run
    (:class:`VerifierFailure`) when more than ``max_frac`` of one step's samples errored.

    A verifier that raises on every sample used to train with loss 0 for the whole run and exit 0,
    showing only a misleading zero-variance alarm.
    """

    def __init__(self, max_frac: float, printer=print):
        self.max_frac = max_frac
        self.printer = printer
        self.shown = False

    def update(self, step: int, rewards: list, verifier_of) -> float:
        """The fraction of ``rewards`` with status ``error`` (raises past ``max_frac``).
        ``verifier_of(i)`` names the verifier of reward ``i``, for messages."""
        errors = [i for i, r in enumerate(rewards) if r.status == "error"]
        frac = len(errors) / max(1, len(rewards))
        if errors and not self.shown:
            self.shown = True
            first = rewards[errors[0]]
            detail = first.info.get("traceback") or first.info.get("error", "(no details)")
            self.printer(f"verifier {verifier_of(errors[0])!r} failed on {len(errors)} of {len(rewards)} samples at step "
                         f"{step} (shown once; counted every step as verify/error_frac). First error:\n{detail.rstrip()}")
        if errors and frac > self.max_frac:
            first = rewards[errors[0]]
            raise VerifierFailure(
                f"verifier {verifier_of(errors[0])!r} failed on {len(errors)} of {len(rewards)} samples at step {step}, "
                f"more than verifier.max_error_frac={self.max_frac:g}: {first.info.get('error', '(no details)')}. Fix the "
                "verifier or its reference data (`rlvr verify` reproduces it offline), or raise verifier.max_error_frac")
        return frac

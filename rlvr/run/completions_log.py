"""``completions.jsonl``: a sample of what the policy wrote during training, step by step, so that reward
hacking (an answer format the verifier mis-reads, a degenerate completion that still scores) shows while
the run goes on, not only in the final evaluation.

Every ``log.completions_every`` steps (0: never) the first whole groups of the step, up to
``log.completions_per_step`` samples (at least one group, cut to that many if a group is larger), are
appended as one JSON object per sample:

    {"step": 10, "group": 0, "sample": 3, "suite": "arithmetic", "problem_id": "arithmetic/train/17",
     "prompt": [{"role": "user", "content": "7+345="}], "completion": "352", "reward": 1.0, "status": "ok",
     "extracted": "352", "finish_reason": "stop", "tokens": 4, "train_reward": 1.0, "valid": true}

``reward`` and ``status`` are the verifier's (or the reward model's) score and status; ``train_reward`` is
the reward the advantages start from (after the failure handling and overlong shaping of
``rlvr/rollout/batch.py``) and ``valid`` whether the sample enters the loss. The advantage itself is not
logged: the recipes compute it later (KL in the reward, guidance, estimators over the whole batch).

On rank 0 only, from that rank's own groups. The file is opened at the first write: a start that fails
writes none. A resumed run drops the lines of steps after its checkpoint first, as ``metrics.jsonl``
does, so no step appears twice.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any, Sequence

from rlvr.verifiers.files import DiskFullError

FILENAME = "completions.jsonl"


class CompletionsLog:
    """Appends sampled completions to ``run_dir/completions.jsonl`` every ``every`` steps (0: off)."""

    def __init__(self, run_dir: str | Path, *, every: int, per_step: int, done: int = 0, enabled: bool = True):
        self.path = Path(run_dir) / FILENAME
        self.every, self.per_step = (every, per_step) if enabled else (0, 0)
        if enabled:
            truncate(self.path, done)

    @classmethod
    def for_run(cls, run_dir: str | Path, log_config, *, done: int, enabled: bool) -> "CompletionsLog":
        """The log a run config's ``log`` section asks for; ``done``: the checkpoint step a resumed run
        continues after (0 for a new run); ``enabled``: this process writes it (rank 0)."""
        return cls(run_dir, every=log_config.completions_every, per_step=log_config.completions_per_step,
                   done=done, enabled=enabled)

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def record(self, step: int, rollout):
        """Log ``rollout`` (its ``groups`` and reward tensors ``samples``) when ``step`` is due; returns it."""
        if self.due(step):
            self.write(step, rollout.groups, getattr(rollout, "samples", None))
        return rollout

    def write(self, step: int, groups: Sequence, samples=None) -> int:
        """Append the chosen samples of ``groups`` (see the module docstring); returns how many. The file
        is opened for each write (one a step at most) and closed again: nothing to close at the end."""
        chosen: list[dict] = []
        for index, group in enumerate(groups):
            records = _records(step, index, group, samples)
            if chosen and len(chosen) + len(records) > self.per_step:
                break  # whole groups only, after the first
            chosen.extend(records[: self.per_step - len(chosen)])
            if len(chosen) >= self.per_step:
                break
        if not chosen:
            return 0
        try:
            with self.path.open("a", encoding="utf-8") as file:
                file.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in chosen))
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise DiskFullError(f"disk full while writing {self.path}; free some space and continue with "
                                    f"--resume {self.path.parent}") from exc
            raise
        return len(chosen)


def _records(step: int, index: int, group, samples) -> list[dict[str, Any]]:
    out = []
    for k, (completion, reward) in enumerate(zip(group.completions, group.rewards)):
        record = {
            "step": step, "group": index, "sample": k, "suite": group.suite, "problem_id": group.problem.id,
            "prompt": group.problem.prompt, "completion": completion.text, "reward": reward.score,
            "status": reward.status, "extracted": _jsonable(reward.info.get("extracted")),
            "finish_reason": completion.finish_reason, "tokens": len(completion.token_ids),
        }
        if samples is not None and index < samples.scores.shape[0] and k < samples.scores.shape[1]:
            record["train_reward"] = float(samples.scores[index, k])
            record["valid"] = bool(samples.valid[index, k])
        out.append(record)
    return out


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def truncate(path: str | Path, step: int) -> None:
    """Keep only the lines of steps up to ``step`` (a torn last line from a crash goes too)."""
    path = Path(path)
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                kept.append(line + "\n")
        except (json.JSONDecodeError, AttributeError):
            continue
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    tmp.replace(path)

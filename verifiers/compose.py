"""``compose``: several verifiers as one reward, from a config-expressible options dict.

::

    verifier:
      name: compose
      options:
        mode: weighted            # weighted | min | gate
        parts:
          - {name: format, gate: true}                      # must pass, or the reward is gate_fail_score
          - {name: math, weight: 1.0}
          - {name: length, weight: 0, options: {mode: overlong, max_length: 4000}}   # logged, not optimised

Each part is ``{name, options={}, weight=1.0, gate=false, min_score=1.0, key=name}``.

* ``weighted``: ``score = sum_i w_i * s_i`` over the parts with ``w_i != 0``;
* ``min``: ``score = min_i s_i`` over the parts with ``w_i != 0`` (a conservative ensemble: every
  checker must agree);
* ``gate``: shorthand for "every part but the last is a gate, the score is the last part's".

A **gate** part passes when its status is ``ok`` and its score ``>= min_score``; when any gate fails
the score is ``gate_fail_score`` ("score B only where A passes": format, then correctness). A gate
part's weight defaults to 0 (it gates, it does not add). A part with ``weight: 0`` is scored and
logged but does not move the reward.

Every part's score lands in ``Reward.components[key]`` (the trainer logs ``reward/<key>``; a part's
own components are kept as ``<key>/<name>``), plus ``gate`` (1.0 / 0.0) when there are gates. The
composite's status is the first ``timeout``/``error`` among the parts that count (weighted or gate
parts); a failing weight-0 part is only noted in ``info``. Parts that abstain are left out of the
sum or minimum; if all counting parts abstain, the composite abstains.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from rlvr.verifiers.base import Reward, Verifier, coerce_reward, context_fields, error_reward, score_sample
from rlvr.verifiers.registry import get_verifier, register_verifier

PART_KEYS = ("name", "options", "weight", "gate", "min_score", "key")
MODES = ("weighted", "min", "gate")


@dataclass
class Part:
    name: str
    impl: Any
    weight: float
    gate: bool
    min_score: float
    key: str
    options: dict = field(default_factory=dict)

    @property
    def counts(self) -> bool:
        return self.gate or self.weight != 0


def build_parts(parts: list, mode: str) -> list[Part]:
    """Validate the ``parts`` option and build each part's verifier (unknown names fail here)."""
    if not isinstance(parts, (list, tuple)) or not parts:
        raise ValueError("compose: 'parts' must be a non-empty list of {name, options, weight, gate, ...}")
    built: list[Part] = []
    used: set[str] = set()
    for i, spec in enumerate(parts):
        if isinstance(spec, str):
            spec = {"name": spec}
        if not isinstance(spec, dict) or "name" not in spec:
            raise ValueError(f"compose: part {i} must be a mapping with a 'name'")
        unknown = sorted(set(spec) - set(PART_KEYS))
        if unknown:
            raise ValueError(f"compose: part {i} has unknown key(s) {unknown}; valid keys: {', '.join(PART_KEYS)}")
        gate = bool(spec.get("gate", mode == "gate" and i < len(parts) - 1))
        weight = float(spec.get("weight", 0.0 if gate else 1.0))
        key = str(spec.get("key", spec["name"]))
        base, n = key, 2
        while key in used:
            key, n = f"{base}_{n}", n + 1
        used.add(key)
        options = dict(spec.get("options") or {})
        built.append(Part(spec["name"], get_verifier(spec["name"], **options), weight, gate,
                          float(spec.get("min_score", 1.0)), key, options))
    if not any(p.counts for p in built):
        raise ValueError("compose: every part has weight 0 and none is a gate; nothing would be optimised")
    return built


@register_verifier("compose")
class ComposeVerifier(Verifier):
    """Weighted sum, minimum or gating of other verifiers (see the module docstring)."""

    name = "compose"
    description = "combine verifiers: weighted sum, min (ensemble), gates, weight-0 logged metrics"

    def __init__(self, parts: list, mode: str = "weighted", gate_fail_score: float = 0.0):
        if mode not in MODES:
            raise ValueError(f"compose: mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.gate_fail_score = float(gate_fail_score)
        self.parts = build_parts(parts, mode)
        self.cacheable = all(getattr(p.impl, "cacheable", True) for p in self.parts)
        self.in_process = all(getattr(p.impl, "in_process", False) for p in self.parts)
        # a part that scores batches (a judge) makes the composite one: scored in the calling process, a
        # batch at a time (its rule-based parts then run there too, without a worker's deadline)
        self.batched = any(getattr(p.impl, "batched", False) for p in self.parts)

    def audit_cases(self) -> list[dict]:
        """The final-answer golden set; wrapped in the think/answer template when a ``format`` part
        checks it (format hacks stay as they are)."""
        from rlvr.verifiers.golden import answer_probes

        probes = answer_probes()
        if any(p.name == "format" for p in self.parts):
            for probe in probes:
                if probe["category"] in ("golden", "hedging") and "<answer>" not in probe["completion"]:
                    probe["completion"] = f"<think>Let me work it out.</think>\n<answer>{probe['completion']}</answer>"
        return probes

    def score(self, completion: str, reference: dict, **context: object) -> Reward:
        """Each part sees the context fields (prompt, finish reason) its own ``score`` takes."""
        return self.score_batch([completion], [reference], [context])[0]

    def score_batch(self, completions: Sequence[str], references: Sequence[dict],
                    contexts: Sequence[dict] | None = None) -> list[Reward]:
        """The composite rewards of a batch. A batched part (a ``judge``) gets the batch in one call, less
        the items an earlier gate already failed: "ask the judge only where the format check passes"
        costs nothing for the rest. (The runner calls this only when a part is batched; otherwise
        :meth:`score` runs item by item in its workers.)"""
        start = time.perf_counter()
        n = len(completions)
        contexts = list(contexts) if contexts is not None else [{} for _ in range(n)]
        rewards: list[list[Reward | None]] = [[None] * len(self.parts) for _ in range(n)]
        gate_failed = [False] * n
        for k, part in enumerate(self.parts):
            batched = getattr(part.impl, "batched", False)
            todo = [i for i in range(n) if not (batched and not part.gate and gate_failed[i])]
            for i, r in zip(todo, _score_part(part, [completions[i] for i in todo], [references[i] for i in todo],
                                              [contexts[i] for i in todo], batched)):
                rewards[i][k] = r
                if part.gate and (r.status != "ok" or r.score < part.min_score):
                    gate_failed[i] = True
        latency = (time.perf_counter() - start) / max(1, n)
        return [self._combine(row, latency) for row in rewards]

    def _combine(self, rewards: list[Reward | None], latency: float) -> Reward:
        """One item's reward from its parts' (None: a batched part skipped behind a failed gate)."""
        components: dict[str, float] = {}
        details: dict[str, dict] = {}
        failure: Reward | None = None
        counted: list[tuple[Part, Reward]] = []
        gate_ok = True
        for part, r in zip(self.parts, rewards):
            if r is None:
                details[part.key] = {"status": "skipped", "reason": "an earlier gate failed"}
                continue
            details[part.key] = {"status": r.status, "score": r.score, **_brief(r.info)}
            if r.status == "ok":
                components[part.key] = r.score
                for k, v in r.components.items():
                    components[f"{part.key}/{k}"] = v
            if not part.counts:
                continue
            if r.failed:
                failure = failure or r
                continue
            if part.gate and (r.status != "ok" or r.score < part.min_score):
                gate_ok = False
            if part.weight != 0 and r.status != "abstain":
                counted.append((part, r))
        if any(p.gate for p in self.parts):
            components["gate"] = float(gate_ok)
        info: dict = {"extracted": next((d.get("extracted") for d in details.values() if d.get("extracted") is not None),
                                        None), "parts": details}
        if failure is not None:
            info["error"] = f"a part failed: {failure.info.get('error', failure.status)}"
            return Reward(0.0, status=failure.status, components=components, latency_s=latency, info=info)
        if not gate_ok:
            return Reward(self.gate_fail_score, components=components, latency_s=latency, info=info)
        if not counted:
            gated_only = all(p.gate or p.weight == 0 for p in self.parts)
            return Reward(1.0 if gated_only else 0.0, status="ok" if gated_only else "abstain",
                          components=components, latency_s=latency, info=info)
        if self.mode == "min":
            total = min(r.score for _, r in counted)
        else:
            total = sum(p.weight * r.score for p, r in counted)
        return Reward(total, components=components, latency_s=latency, info=info)


def _score_part(part: Part, completions: list[str], references: list[dict], contexts: list[dict],
                batched: bool) -> list[Reward]:
    """One part's rewards for the items given (a batched part in one call; an exception is an error)."""
    if batched:
        wanted = context_fields(part.impl)
        try:
            values = part.impl.score_batch(completions, references,
                                           [{k: v for k, v in x.items() if k in wanted} for x in contexts])
            return [coerce_reward(v) for v in values]
        except Exception as exc:
            return [error_reward(exc) for _ in completions]
    out = []
    for completion, reference, context in zip(completions, references, contexts):
        try:
            out.append(coerce_reward(score_sample(part.impl, completion, reference, context)))
        except Exception as exc:
            out.append(error_reward(exc))
    return out


def _brief(info: dict) -> dict:
    """The part of a sub-verifier's info worth keeping in the composite's (short values only)."""
    return {k: v for k, v in info.items() if k in ("extracted", "error", "hedged", "source") and
            (v is None or isinstance(v, (str, int, float, bool)))}

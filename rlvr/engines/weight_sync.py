"""Keeping the engine on the current policy: push the weights after every optimizer step, then prove
they arrived.

The proof is a canary. A fixed prompt (long enough to fill prefix-cache blocks) is continued greedily
by the engine, and the log-probabilities the engine reports for its tokens are compared with the
trainer's own for the same tokens. Two failures stop the run with :class:`StaleEngineError`:

* **wrong weights**: the two differ by more than a dtype-aware tolerance (fp32 engines agree with
  the trainer to ~1e-6; a missed tied ``lm_head``, a stale prefix cache or a half-applied update
  gives differences of 0.1 to several nats);
* **stale weights**: the trainer's log-probabilities moved since the last check and the engine's
  moved by less than a hundredth of that: the update never reached it (this catches steps whose
  effect is below the tolerance, e.g. in bfloat16; an engine that did take the update moves with
  the trainer, up to its numerical noise).

An engine that generates with the trainer's own module (``weight_sync == "shared"``, the HF engine)
cannot be stale: it gets no push and no canary (``check()`` still works on it, e.g. in tests).
"""

from __future__ import annotations

import time

import torch

from rlvr.engines.base import SamplingParams, call_optional
from rlvr.modeling.logprobs import completion_logprobs
from rlvr.modeling.loading import iter_inference_weights

#: Engine-vs-trainer tolerance on the canary's log-probabilities (max absolute difference, nats).
CANARY_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.5, "float16": 0.1}
CANARY_TEXT = (
    "The canary checks that the engine serves the weights the trainer has just written: "
    "if the sampler's log-probabilities differ from the trainer's, the run stops. "
)
#: The trainer's canary log-probabilities must move by more than this before an engine that did not
#: follow is called stale (below it, a step may be lost in the engine's numerical noise).
STALE_MOVE = 1e-4
#: ... and the engine must have moved by less than this fraction of the trainer's move.
STALE_RATIO = 0.01


class StaleEngineError(RuntimeError):
    """The engine does not serve the policy the trainer holds (the canary failed)."""


class EngineSync:
    """Pushes the policy's weights into the engine and runs the canary; see the module docstring.

    Args:
        engine: the generation engine.
        policy: the trainer's policy module.
        tokenizer: encodes the canary prompt.
        dtype: the policy's dtype name, for the default tolerance.
        tolerance: max allowed |engine - trainer| log-prob on the canary; None = by dtype.
        canary: run the canary after each push.
        prompt_tokens: canary prompt length (capped by ``max_len - new_tokens``).
        new_tokens: canary tokens the engine generates and both sides score.
        max_len: the model's context length, when known.
    """

    def __init__(self, engine, policy, tokenizer, *, dtype: str = "float32", tolerance: float | None = None,
                 canary: bool = True, prompt_tokens: int = 160, new_tokens: int = 8, max_len: int | None = None,
                 deferred: bool = False):
        self.engine, self.policy, self.tokenizer = engine, policy, tokenizer
        self.canary, self.deferred = canary, deferred
        self._pending = None  # deferred: (ticket, trainer's tokens, trainer's log-probs) of the last publication
        self.tolerance = CANARY_TOLERANCE.get(dtype, 0.5) if tolerance is None else tolerance
        self.dtype = dtype
        if max_len is not None:
            prompt_tokens = max(1, min(prompt_tokens, max_len - new_tokens))
        self.prompt = canary_prompt(tokenizer, prompt_tokens)
        self.new_tokens = new_tokens
        self._last: tuple[list[int], torch.Tensor, torch.Tensor] | None = None

    def push(self) -> dict[str, float]:
        """Send the current weights, then check; returns ``sync/seconds`` and, with the canary on,
        ``sync/canary_max_abs_diff``. An engine that shares the trainer's module gets neither."""
        if self.engine.weight_sync == "shared":
            return {}
        start = time.perf_counter()
        lora = "adapter" if self.engine.weight_sync == "adapter" else "merge"
        self.engine.update_weights(iter_inference_weights(self.policy, lora=lora))
        metrics = {"sync/seconds": time.perf_counter() - start}
        if self.canary and self.deferred:
            metrics.update(self.settle())
            self._pending = self._submit_canary()
        elif self.canary:
            metrics["sync/canary_max_abs_diff"] = self.check()
        return metrics

    def _submit_canary(self):
        """Queue the canary behind the weights (an engine with ``submit``) and take the trainer's side now,
        while it still holds the weights just published: its greedy tokens and their log-probabilities."""
        from rlvr.engines.hf import HFEngine

        sampling = SamplingParams(max_new_tokens=self.new_tokens, greedy=True)
        ticket = self.engine.submit([self.prompt], 1, sampling)
        tokens = list(HFEngine(self.policy, self.tokenizer).generate([self.prompt], 1, sampling)[0][0].token_ids)
        return ticket, tokens, self._trainer_logprobs(tokens)

    def settle(self) -> dict[str, float]:
        """Check the canary of the last publication (deferred mode: ``push`` queues it behind the weights
        and the next push, or an evaluation, checks it, so the trainer never waits for the engine's
        queue); ``sync/canary_max_abs_diff``, or nothing when none is pending."""
        if self._pending is None:
            return {}
        ticket, tokens, trainer_logp = self._pending
        self._pending = None
        completion = self.engine.result(ticket)[0][0][0]
        if list(completion.token_ids) != tokens:
            raise StaleEngineError("the engine is serving stale or wrong weights: its greedy continuation of the sync "
                                   "canary differs from the trainer's for the same published weights. Stopping.")
        engine_logp = torch.tensor(completion.logprobs, dtype=torch.float64)
        return {"sync/canary_max_abs_diff": self._compare(tokens, engine_logp, trainer_logp)}

    def check(self) -> float:
        """Run the canary; the max |engine - trainer| log-prob, or :class:`StaleEngineError`."""
        sampling = SamplingParams(max_new_tokens=self.new_tokens, greedy=True)
        completion = self.engine.generate([self.prompt], 1, sampling)[0][0]
        tokens = list(completion.token_ids)
        return self._compare(tokens, torch.tensor(completion.logprobs, dtype=torch.float64),
                             self._trainer_logprobs(tokens))

    def _compare(self, tokens: list[int], engine_logp: torch.Tensor, trainer_logp: torch.Tensor) -> float:
        """The max |engine - trainer| canary log-prob, or :class:`StaleEngineError` (module docstring)."""
        diff = float((engine_logp - trainer_logp).abs().max())
        if not diff <= self.tolerance:  # also catches NaN
            raise StaleEngineError(
                f"the engine is serving stale or wrong weights: on the sync canary its log-probabilities differ "
                f"from the trainer's by up to {diff:.3g} nats (tolerance {self.tolerance:g} for {self.dtype}). "
                "Training on its samples would optimise a policy other than the one being trained; stopping. "
                "Raise engine.canary_tolerance only if the engine's numerics are known to differ this much.")
        if self._last is not None and self._last[0] == tokens:
            trainer_moved = float((trainer_logp - self._last[2]).abs().max())
            engine_moved = float((engine_logp - self._last[1]).abs().max())
            if trainer_moved > STALE_MOVE and engine_moved < STALE_RATIO * trainer_moved:
                raise StaleEngineError(
                    f"the engine is serving stale weights: since the last sync the trainer's canary log-probabilities "
                    f"moved by up to {trainer_moved:.3g} nats and the engine's by {engine_moved:.3g}, so the weight "
                    "update did not reach it. Stopping.")
        self._last = (tokens, engine_logp, trainer_logp)
        return diff

    @torch.no_grad()
    def _trainer_logprobs(self, tokens: list[int]) -> torch.Tensor:
        device = next(self.policy.parameters()).device
        ids = torch.tensor([self.prompt + tokens], device=device)
        was_training = self.policy.training
        self.policy.eval()  # no dropout: the engine runs without it
        try:
            logp, _ = completion_logprobs(self.policy, ids, torch.ones_like(ids), len(tokens), temperature=1.0)
        finally:
            self.policy.train(was_training)
        return logp[0].double().cpu()


def canary_prompt(tokenizer, length: int) -> list[int]:
    """``length`` token ids of :data:`CANARY_TEXT` repeated (the same ids for every check)."""
    ids = tokenizer(CANARY_TEXT, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("the tokenizer encodes the canary text to no tokens")
    return (ids * (length // len(ids) + 1))[:length]


def start_engine(engine_config, policy, tokenizer, *, dtype: str, context: int | None, copy=None, built=None,
                 deferred: bool = False):
    """``(engine, sync)``: the engine of ``engine_config`` (an ``EngineConfig``), given the policy's
    weights and checked by the canary once. ``copy``: a whole model the HF engine generates from
    instead of the policy module (a sharded policy's :func:`rlvr.modeling.loading.generation_copy`),
    sent the policy's weights after every update. ``built``: an engine made already (the generator
    process of asynchronous generation), taken as it is; ``deferred``: its canary is checked at the
    next push (:meth:`EngineSync.settle`), not waited for."""
    from rlvr.engines import build_engine

    own = {"weight_sync": "merged"} if copy is not None else {}
    engine = built if built is not None else build_engine(
        engine_config.name, policy if copy is None else copy, tokenizer, max_batch_size=engine_config.max_batch_size,
        **engine_config.options, **own)
    # a process engine shares no prefix cache to fill: a short canary proves its weights as well, at a
    # fraction of the trainer's side of the check (which, at a 0.1 s step, is not negligible)
    size = {"prompt_tokens": 32, "new_tokens": 4} if built is not None else {}
    sync = EngineSync(engine, policy, tokenizer, dtype=dtype, tolerance=engine_config.canary_tolerance,
                      canary=engine_config.canary, max_len=context, deferred=deferred, **size)
    try:
        sync.push()  # a resumed or LoRA policy differs from the folder the engine loaded
    except BaseException:
        call_optional(engine, "close")
        raise
    return engine, sync


def send_weights(engine, policy) -> None:
    """Push a sharded policy's weights into ``engine`` (a whole copy, ``weight_sync: merged``), or, on a
    rank without an engine (``None``), only take part in gathering each weight: every rank must."""
    weights = iter_inference_weights(policy)
    if engine is None:
        for _ in weights:
            pass
    else:
        engine.update_weights(weights)


def evaluation_engine(model, tokenizer, *, sharded: bool, dtype: str, device, needed: bool = True):
    """The HF engine an offline recipe (SFT, DPO) evaluates with: over ``model`` itself; or, for a sharded
    model, over a whole copy on the rank that evaluates (``needed``; None on the others), which
    :func:`send_weights` brings up to date before each evaluation."""
    from rlvr.engines.hf import HFEngine
    from rlvr.modeling.loading import generation_copy

    if not sharded:
        return HFEngine(model, tokenizer)
    return HFEngine(generation_copy(model, dtype, device), tokenizer, weight_sync="merged") if needed else None

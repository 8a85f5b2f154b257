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

**Deferred mode** (the generator process of asynchronous generation): the canary is queued behind the
weights and checked at the next push, so the trainer never waits for the engine's queue. The trainer
cannot score the engine's tokens then (its weights have moved on), so at the push it takes its own
greedy path and every token's log-probability along it. Where the engine's greedy token differs (a
near-tie that other numerics resolve otherwise: another device, another dtype), it is accepted when the
trainer rates it within the tolerance of its own top token; the tokens up to and including that one are
compared as above (the prefix is shared), and what follows is not (it continues another prefix). A
damaged publication still moves the compared log-probabilities by far more than the tolerance.
"""

from __future__ import annotations

import time

import torch

from rlvr.engines.base import SamplingParams, call_optional
from rlvr.modeling.logprobs import completion_logits, completion_logprobs
from rlvr.modeling.precision import autocast
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
        tolerance: max allowed |engine - trainer| log-prob on the canary; None = by dtype (the coarser of the
            policy's and the engine's, when the engine names its own ``dtype``).
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
        self._pending = None  # deferred: (ticket, trainer's tokens, its log-probs [T, V]) of the last publication
        engine_dtype = getattr(engine, "dtype", None)
        dtypes = [dtype] + ([engine_dtype] if isinstance(engine_dtype, str) and engine_dtype != dtype else [])
        self.tolerance = max(CANARY_TOLERANCE.get(d, 0.5) for d in dtypes) if tolerance is None else tolerance
        self.dtype = dtype if len(dtypes) == 1 else f"a {dtype} trainer and a {engine_dtype} engine"
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
        while it still holds the weights just published: its greedy tokens and, at each of them, the
        log-probability of every token ``[T, V]`` (to judge a token the engine chose otherwise)."""
        from rlvr.engines.hf import HFEngine

        sampling = SamplingParams(max_new_tokens=self.new_tokens, greedy=True)
        ticket = self.engine.submit([self.prompt], 1, sampling)
        tokens = list(HFEngine(self.policy, self.tokenizer).generate([self.prompt], 1, sampling)[0][0].token_ids)
        return ticket, tokens, self._trainer_rows(tokens)

    def settle(self) -> dict[str, float]:
        """Check the canary of the last publication (deferred mode: ``push`` queues it behind the weights,
        and the next ``push``, or the end of the run (``RLRun.finish``), checks it, so the trainer never waits
        for the engine's queue; an evaluation in between does not check it); ``sync/canary_max_abs_diff``, or
        nothing when none is pending."""
        if self._pending is None:
            return {}
        ticket, tokens, rows = self._pending
        self._pending = None
        completion = self.engine.result(ticket)[0][0][0]
        served = list(completion.token_ids)
        checked = served[: self._shared_prefix(tokens, served, rows) + 1]
        engine_logp = torch.tensor(completion.logprobs[: len(checked)], dtype=torch.float64)
        trainer_logp = rows[torch.arange(len(checked)), checked]  # the same tokens after the same prefix
        return {"sync/canary_max_abs_diff": self._compare(checked, engine_logp, trainer_logp)}

    def _shared_prefix(self, tokens: list[int], served: list[int], rows: torch.Tensor) -> int:
        """How many leading tokens the engine's greedy continuation ``served`` shares with the trainer's
        ``tokens``; where it then differs, its token must be a near-tie for the trainer (``rows [T, V]``:
        the trainer's log-probs along its own path), else :class:`StaleEngineError`."""
        shared = next((i for i, (a, b) in enumerate(zip(tokens, served)) if a != b), min(len(tokens), len(served)))
        if shared == len(tokens) == len(served):
            return shared
        if shared in (len(tokens), len(served)):  # one stopped where the other goes on: no token to judge
            raise StaleEngineError(f"the engine is serving stale or wrong weights: its greedy continuation of the sync "
                                   f"canary and the trainer's agree on {shared} tokens, then one stops and the "
                                   "other goes on. Stopping.")
        gap = float(rows[shared].max() - rows[shared, served[shared]])
        if not gap <= self.tolerance:  # also catches NaN
            raise StaleEngineError(
                f"the engine is serving stale or wrong weights: its greedy continuation of the sync canary differs "
                f"from the trainer's at token {shared}, and not by a near-tie: the trainer rates the engine's token "
                f"{gap:.3g} nats below its own greedy one (tolerance {self.tolerance:g} for {self.dtype}). Stopping.")
        return shared

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
    def _trainer_rows(self, tokens: list[int]) -> torch.Tensor:
        """``[T, V]``: the trainer's log-probability of every token at each of the T canary positions after
        the prompt and ``tokens[:t]`` (float64, on the CPU)."""
        device = next(self.policy.parameters()).device
        ids = torch.tensor([self.prompt + tokens], device=device)
        was_training = self.policy.training
        self.policy.eval()  # no dropout: the engine runs without it
        try:
            with autocast(self.policy):  # the compute dtype of float32 master weights, as completion_logprobs runs
                logits = completion_logits(self.policy, ids, torch.ones_like(ids), len(tokens))  # [1, T, V]
        finally:
            self.policy.train(was_training)
        return torch.log_softmax(logits[0].double(), dim=-1).cpu()

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


def evaluation_engine(model, tokenizer, *, dtype: str, device, needed: bool = True):
    """The HF engine an offline recipe (SFT, DPO) evaluates with: over ``model`` itself, or over a whole
    copy in the compute dtype where the engine cannot or should not decode from it (a sharded model, or
    float32 master weights computing in bf16: :func:`rlvr.modeling.loading.needs_engine_copy`), made on
    the rank that evaluates (``needed``; None on the others). :func:`refresh_evaluation_engine` brings
    the copy up to date before each evaluation."""
    from rlvr.engines.hf import HFEngine
    from rlvr.modeling.loading import generation_copy, needs_engine_copy

    if not needs_engine_copy(model):
        return HFEngine(model, tokenizer)
    return HFEngine(generation_copy(model, dtype, device), tokenizer, weight_sync="merged") if needed else None


def refresh_evaluation_engine(engine, model) -> None:
    """Before an evaluation: send ``model``'s weights into the copy :func:`evaluation_engine` made (every
    rank of a sharded model takes part in gathering them); nothing where the engine decodes from
    ``model`` itself."""
    from rlvr.modeling.loading import needs_engine_copy
    from rlvr.run.sharding import is_sharded

    if needs_engine_copy(model) and (engine is not None or is_sharded(model)):
        send_weights(engine, model)

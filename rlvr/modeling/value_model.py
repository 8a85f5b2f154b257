"""The critic of PPO: V(s_t), a scalar at every response position, from a transformer body and a
linear head.

Two layouts, chosen by the policy (:func:`build_critic`):

* **LoRA policy**: the critic is a second LoRA adapter, ``value``, on the policy's own frozen base,
  plus the head. One copy of the base weights serves both: the critic's forward switches the active
  adapter to ``value`` and back. Each forward uses only its own adapter, so each backward reaches
  only its own parameters; both adapters stay ``requires_grad`` (peft's ``set_adapter`` turns the
  inactive one off, which would drop the critic's gradients when the backward runs after the switch
  back), and :func:`policy_parameters` tells the policy's apart.
* **full fine-tuning**: the critic is its own body (``AutoModel``: the causal LM without its output
  layer) loaded from the policy's folder or from a reward model's, plus the head.

Alignment: the value of the state before response token t is read from the hidden state at the
position that predicts token t, the same positions whose logits give the token's log-prob
(:func:`rlvr.modeling.logprobs.completion_logprobs`). ``V [B, T]`` lines up with ``logp [B, T]``.

Head initialisation: zeros (every state worth 0 at the start, so the first advantages are the GAE of
the raw rewards), or a reward model's ``score`` layer when the critic starts from one.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from rlvr.modeling.logprobs import position_ids
from rlvr.modeling.loading import check_model_folder, is_lora, resolve_dtype
from rlvr.modeling.precision import autocast
from rlvr.modeling.sharded_loading import gather_dtype, load_into_shards, on_rank0, parameters_on_meta

VALUE_ADAPTER = "value"
HEAD_FILE = "value_head.safetensors"


class ValueModel(nn.Module):
    """V(s_t) for the response positions of a rollout batch. Build it with :func:`build_critic`."""

    def __init__(self, body: nn.Module, head: nn.Linear, *, policy=None):
        super().__init__()
        self.head = head  # float32 [hidden -> 1]
        # With a LoRA policy, body and policy are held in a tuple, not as submodules: their weights
        # belong to the policy (saved, counted and moved with it, never twice).
        self._shared = (policy, body) if policy is not None else None
        if policy is None:
            self.body = body

    @property
    def shares_policy_base(self) -> bool:
        return self._shared is not None

    @property
    def _shared_policy(self):
        return self._shared[0] if self._shared is not None else None

    def _run_body(self, **inputs) -> torch.Tensor:
        body = self._shared[1] if self.shares_policy_base else self.body
        with self._value_adapter():
            return body(**inputs).last_hidden_state

    @contextlib.contextmanager
    def _value_adapter(self) -> Iterator[None]:
        if not self.shares_policy_base:
            yield
            return
        previous = self._shared_policy.active_adapter
        self._shared_policy.set_adapter(VALUE_ADAPTER)
        try:
            yield
        finally:
            self._shared_policy.set_adapter(previous)
            _keep_value_adapter_trainable(self._shared_policy)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int, *,
                with_bootstrap: bool = False):
        """``values [B, T]`` (float32) for a batch laid out ``[left-padded prompt | completion (T)]``:
        ``values[b, t]`` = V(prompt + the first t completion tokens).

        ``with_bootstrap`` also returns ``[B]``, the value of the whole sequence (the state after its
        last real completion token), for bootstrapping a truncated response's return.
        """
        T = completion_len
        with autocast(self):  # a float32 body computing in model.dtype (rlvr/modeling/precision.py)
            hidden = self._run_body(input_ids=input_ids, attention_mask=attention_mask,
                                    position_ids=position_ids(attention_mask), use_cache=False)  # [B, W + T, H]
        states = hidden[:, -(T + 1):]  # [B, T + 1, H]: index t is the position that predicts token t
        v_all = self.head(states.float()).squeeze(-1)  # [B, T + 1]
        if not with_bootstrap:
            return v_all[:, :T]
        lengths = attention_mask[:, -T:].sum(dim=1)  # [B] real completion tokens: index k follows the last one
        return v_all[:, :T], v_all.gather(1, lengths.unsqueeze(1)).squeeze(1)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What the critic's optimizer steps: the head plus the value adapter, or the head plus the body."""
        if not self.shares_policy_base:
            return [p for p in self.parameters() if p.requires_grad]
        return _value_adapter_parameters(self._shared_policy) + list(self.head.parameters())

    def save(self, path: str | Path) -> Path:
        """A folder :func:`build_critic` reloads with ``resume_from``: the head, and the value adapter or the body."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.shares_policy_base:
            self._shared_policy.save_pretrained(str(path), selected_adapters=[VALUE_ADAPTER])  # -> path/value/
        else:
            self.body.save_pretrained(str(path))
        save_file({k: v.detach().contiguous().cpu() for k, v in self.head.state_dict().items()}, str(path / HEAD_FILE))
        return path


def build_critic(policy, *, path: str | Path | None, dtype: str = "float32", device: str | torch.device = "cpu",
                 lora: dict | None = None, resume_from: str | Path | None = None,
                 gradient_checkpointing: bool = False, shard: bool = False, compute_dtype: str = "float32",
                 offload: bool = False) -> ValueModel:
    """The critic for ``policy``: a ``value`` adapter on its base (LoRA policy) or its own body.

    ``path`` (full fine-tuning only) is the folder the body starts from: the policy's model folder,
    or a reward model's (a sequence-classification folder: its ``score`` layer becomes the head).
    ``lora`` holds the policy's LoRA fields, reused for the value adapter. ``resume_from`` is a
    folder written by :meth:`ValueModel.save`. ``gradient_checkpointing`` applies to a critic's own body
    (a LoRA critic runs in the policy's, checkpointed or not as the policy is).

    ``shard`` (``train.strategy: fsdp2``; every rank calls this): a critic with its own body is loaded
    straight into FSDP2 shards (:mod:`rlvr.modeling.sharded_loading`: one unit per body layer, the root
    holding the head and the rest; all-gathered in ``compute_dtype``; ``offload``: shards on the CPU), so
    no rank's device holds the whole critic; rank 0 builds it whole on its CPU as without ``shard``, and
    every rank's shards hold exactly those weights.
    """
    hidden = policy.config.hidden_size
    if is_lora(policy):
        head = _zero_head(hidden, device)
        _add_value_adapter(policy, lora, resume_from)
        body = policy.get_base_model().get_decoder()
        critic = ValueModel(body, head, policy=policy)
    else:
        source = Path(resume_from) if resume_from is not None else check_model_folder(path, "critic.path")
        if shard:
            return _sharded_critic(hidden, source, dtype=dtype, device=device, fresh=resume_from is None,
                                   gradient_checkpointing=gradient_checkpointing,
                                   param_dtype=gather_dtype(compute_dtype), offload=offload)
        critic = _own_body_critic(hidden, source, dtype=dtype, device=device, fresh=resume_from is None,
                                  gradient_checkpointing=gradient_checkpointing)
    if resume_from is not None:
        _load_head(critic.head, Path(resume_from), device)
    return critic


def _zero_head(hidden: int, device) -> nn.Linear:
    """The value head, float32 [hidden -> 1], all zeros: every state is worth 0 at the start."""
    head = nn.Linear(hidden, 1, bias=True, dtype=torch.float32, device=device)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


def _load_head(head: nn.Linear, folder: Path, device) -> None:
    from safetensors.torch import load_file

    head.load_state_dict(load_file(str(folder / HEAD_FILE), device=str(device)))


def _own_body_critic(hidden: int, source: Path, *, dtype: str, device, fresh: bool,
                     gradient_checkpointing: bool) -> ValueModel:
    """A critic with its own body, loaded whole from ``source``; a ``fresh`` one (not resumed) starts its
    head from a reward model's ``score`` layer when ``source`` holds one."""
    from transformers import AutoModel

    body = AutoModel.from_pretrained(str(source), dtype=resolve_dtype(dtype)).to(device)
    if gradient_checkpointing:
        body.gradient_checkpointing_enable()
    body.train()
    head = _zero_head(hidden, device)
    if fresh:
        _head_from_reward_model(head, source)
    return ValueModel(body, head)


def _sharded_critic(hidden: int, source: Path, *, dtype: str, device, fresh: bool, gradient_checkpointing: bool,
                    param_dtype: torch.dtype | None, offload: bool) -> ValueModel:
    """:func:`_own_body_critic` loaded into FSDP2 shards: rank 0 builds it whole on its CPU (a resumed one
    with its saved head), every rank its structure, and :func:`load_into_shards` sends rank 0's weights."""
    from transformers import AutoConfig, AutoModel

    def load_whole() -> ValueModel:
        critic = _own_body_critic(hidden, source, dtype=dtype, device="cpu", fresh=fresh, gradient_checkpointing=False)
        if not fresh:
            _load_head(critic.head, source, "cpu")
        return critic

    whole = on_rank0(load_whole)
    with parameters_on_meta():
        body = AutoModel.from_config(AutoConfig.from_pretrained(str(source)), dtype=resolve_dtype(dtype))
        structure = ValueModel(body, nn.Linear(hidden, 1, bias=True, dtype=torch.float32))
    if gradient_checkpointing:
        body.gradient_checkpointing_enable()
    structure.train()
    return load_into_shards(structure, whole, device=device, param_dtype=param_dtype, offload=offload,
                            layers=body.layers)


def policy_parameters(policy, critic: ValueModel) -> list[nn.Parameter]:
    """The policy's trainable parameters, without the critic's (a LoRA critic's adapter lives in the policy)."""
    critic_ids = {id(p) for p in critic.trainable_parameters()}
    return [p for p in policy.parameters() if p.requires_grad and id(p) not in critic_ids]


def _value_adapter_parameters(policy) -> list[nn.Parameter]:
    return [p for n, p in policy.named_parameters() if f".{VALUE_ADAPTER}." in n and "lora_" in n]


def _keep_value_adapter_trainable(policy) -> None:
    for p in _value_adapter_parameters(policy):
        p.requires_grad_(True)


def _add_value_adapter(policy, lora: dict | None, resume_from) -> None:
    from peft import LoraConfig

    if resume_from is not None:
        policy.load_adapter(str(Path(resume_from) / VALUE_ADAPTER), adapter_name=VALUE_ADAPTER, is_trainable=True)
    else:
        if lora is None:
            raise ValueError("a LoRA policy's critic needs the policy's LoRA settings (model.lora)")
        config = LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                            target_modules=lora["target_modules"], task_type="CAUSAL_LM")
        policy.add_adapter(VALUE_ADAPTER, config)
    policy.set_adapter("default")  # the policy stays the active adapter; the critic switches in and out
    _keep_value_adapter_trainable(policy)


def _head_from_reward_model(head: nn.Linear, folder: Path) -> None:
    """Start the head from a sequence-classification reward model's one-label ``score`` layer, when
    the folder holds one (a plain causal-LM folder keeps the zero head)."""
    from safetensors import safe_open

    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            if "score.weight" in f.keys():
                weight = f.get_tensor("score.weight")
                if weight.shape != head.weight.shape:
                    raise ValueError(f"critic.path: {folder} has a score layer of shape {tuple(weight.shape)}; a "
                                     f"reward model's must be {tuple(head.weight.shape)} (one label)")
                with torch.no_grad():
                    head.weight.copy_(weight.float())
                    if "score.bias" in f.keys():
                        head.bias.copy_(f.get_tensor("score.bias").float())
                return

"""FSDP2 sharding (``rlvr.run.sharding``): two ranks holding half of every parameter compute, on halves
of a batch, the gradient one process computes on the whole batch (summed, not averaged), through the
model's own forward and through the chunked log-probs that use the output layer outside it, and an
update stays in lockstep when one rank has nothing to compute."""

from __future__ import annotations

import datetime
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(vocab: int):
    """Two prompts x four rows (left padding on one prompt), completions of different lengths."""
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (2, 5), generator=g).repeat_interleave(4, 0)
    ids = torch.cat([prompts, torch.randint(3, vocab, (8, 4), generator=g)], dim=1)
    mask = torch.ones_like(ids)
    mask[:4, :2] = 0
    for row in range(8):
        mask[row, 5 + 1 + row % 4 :] = 0
    return ids, mask


def _gradients(model_path, rows: slice, chunk_mb: float, sharded: bool) -> dict[str, torch.Tensor]:
    from rlvr.modeling import fast_forward
    from rlvr.modeling.loading import load_policy
    from rlvr.modeling.logprobs import completion_logprobs, set_logits_chunk
    from rlvr.run.sharding import shard_model

    torch.manual_seed(0)
    policy = load_policy(model_path).double()
    set_logits_chunk(policy, chunk_mb)
    if sharded:
        shard_model(policy)
        reason = fast_forward.unsupported_reason(policy)  # rlvr's forward reads whole weights
        assert reason is not None and "FSDP2-sharded" in reason
    ids, mask = _batch(policy.config.vocab_size)
    scored = mask[:, -4:].double()
    weights = torch.linspace(-1.0, 2.0, 32, dtype=torch.float64).view(8, 4) * scored / scored.sum()  # global denominators
    logp, _ = completion_logprobs(policy, ids[rows], mask[rows], 4)
    (logp * weights[rows]).sum().backward()
    return {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for name, p in policy.named_parameters()}


def _rank(rank: int, world: int, port: int, model_path, chunk_mb: float, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        grads = _gradients(model_path, slice(rank * 4, rank * 4 + 4), chunk_mb, sharded=True)
        if rank == 0:
            out.update(grads)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("chunk_mb", [0, 1e-5], ids=["whole-logits", "chunked-logits"])
def test_two_sharded_ranks_sum_to_the_one_process_gradient(tiny_model, chunk_mb):
    expected = _gradients(tiny_model, slice(0, 8), chunk_mb, sharded=False)
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(2, _free_port(), tiny_model, chunk_mb, out), nprocs=2)
        sharded = dict(out)
    assert set(sharded) == set(expected)
    for name, grad in expected.items():  # sharded passes run whole rows, one process shares prompts: the model's
        # rotary tables are float32 even in a float64 model, so the two orders of work differ by ~1e-7
        torch.testing.assert_close(sharded[name], grad, rtol=1e-6, atol=1e-6, msg=name)


def _update(model_path, rows: torch.Tensor, dist, sharded: bool) -> dict[str, torch.Tensor]:
    """One GRPO update (SGD, micro-batches of 2) of the tiny policy on ``rows`` of the batch of
    tests/test_distributed.py, float64; returns the whole weights afterwards."""
    from test_distributed import _batch as rl_batch

    from rlvr.config import RunConfig, build_config
    from rlvr.modeling.loading import load_policy, load_tokenizer
    from rlvr.recipes.update import UpdateSettings, update_policy
    from rlvr.run.sharding import shard_model

    torch.manual_seed(0)
    policy = load_policy(model_path).double()
    batch = rl_batch(len(load_tokenizer(model_path)))
    batch.advantages = torch.tensor([1.0, -0.5, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    batch = batch.select(rows)
    batch.engine_logp, batch.response_mask = batch.engine_logp.double(), batch.response_mask.double()
    if sharded:
        shard_model(policy)
    config = build_config(RunConfig, {"model": {"path": str(model_path)}}, [
        "algorithm.beta=0", "train.micro_batch_size=2", "generation.max_new_tokens=4", "optim.grad_clip=1000"])
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
    update_policy(policy, batch, optimizer, UpdateSettings.from_config(config, dist))
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in policy.named_parameters()}


def _update_rank(rank: int, world: int, port: int, model_path, out: dict) -> None:
    from rlvr.run.runtime import Distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        torch.set_num_threads(1)
        weights = _update(model_path, torch.arange(rank * 4, rank * 4 + 4), Distributed(rank=rank, world_size=world),
                          sharded=True)
        if rank == 0:
            out.update(weights)
    finally:
        torch.distributed.destroy_process_group()


def test_a_sharded_update_runs_in_lockstep_when_a_rank_has_nothing_to_learn_from(tiny_model):
    """Rank 1's half of the batch has only zero advantages: it computes no row of its own, yet runs
    as many passes as rank 0 (FSDP2's collectives pair up), and the step equals one process's."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from rlvr.run.runtime import Distributed

    expected = _update(tiny_model, torch.arange(8), Distributed(), sharded=False)
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_update_rank, args=(2, _free_port(), tiny_model, out), nprocs=2)
        sharded = dict(out)
    for name, value in expected.items():  # whole rows against shared prompts: float32 rotary rounding, as above
        torch.testing.assert_close(sharded[name], value, rtol=1e-6, atol=1e-6, msg=name)

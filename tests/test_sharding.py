"""FSDP2 sharding (``rlvr.run.sharding``): two ranks holding half of every parameter compute, on halves
of a batch, the gradient one process computes on the whole batch (summed, not averaged), through the
model's own forward and through the chunked log-probs that use the output layer outside it."""

from __future__ import annotations

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
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
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
    for name, grad in expected.items():
        torch.testing.assert_close(sharded[name], grad, rtol=1e-10, atol=1e-12, msg=name)

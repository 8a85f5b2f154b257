"""Data-parallel training on the CPU (gloo): two ranks on halves of a batch take exactly the step one
process takes on the whole batch, for every loss aggregation mode."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from rlvr.run.runtime import Distributed

AGGREGATIONS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(vocab: int, n: int = 8, width: int = 5, length: int = 4):
    """A batch with left padding, completions of different lengths (1..4 tokens), a masked row,
    and advantages of both signs, some zero (rows the update skips)."""
    from rlvr.rollout.batch import Batch

    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, vocab, (n, width + length), generator=g)
    attention_mask = torch.ones_like(input_ids)
    response_mask = torch.zeros(n, length)
    for i in range(n):
        attention_mask[i, : i % 3] = 0  # left padding
        k = 1 + i % length
        response_mask[i, :k] = 1
        attention_mask[i, width + k :] = 0
    response_mask[5] = 0  # a sample masked out (e.g. its verification failed)
    advantages = torch.tensor([1.0, -0.5, 0.0, 2.0, -1.0, 0.7, 0.0, -0.3])
    return Batch(input_ids, attention_mask, response_mask, torch.zeros(n, length), advantages)


def _one_step(model_path, batch, dist: Distributed, agg: str, entropy: float):
    from rlvr.config import RunConfig, build_config
    from rlvr.modeling.loading import load_policy
    from rlvr.recipes.update import UpdateSettings, update_policy

    torch.manual_seed(0)
    policy = load_policy(model_path)
    config = build_config(RunConfig, {"model": {"path": str(model_path)}}, [
        f"algorithm.loss_agg={agg}", "algorithm.beta=0", f"algorithm.entropy_coef={entropy}",
        "train.micro_batch_size=2", "generation.max_new_tokens=4", "optim.grad_clip=1000"])
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
    metrics = update_policy(policy, batch, optimizer, UpdateSettings.from_config(config, dist))
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}, metrics


CASES = [(agg, entropy) for agg in AGGREGATIONS for entropy in (0.0, 0.01)]


def _rank(rank: int, world: int, port: int, model_path, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        from rlvr.modeling.loading import load_tokenizer

        batch = _batch(len(load_tokenizer(model_path)))
        half = batch.select(torch.arange(rank * 4, rank * 4 + 4))  # whole groups per rank
        for agg, entropy in CASES:
            weights, metrics = _one_step(model_path, half, Distributed(rank=rank, world_size=world), agg, entropy)
            out[(rank, agg, entropy)] = (weights, metrics["train/grad_norm"])
    finally:
        torch.distributed.destroy_process_group()


def test_two_ranks_on_halves_take_the_same_step_as_one_process(tiny_model):
    """For every aggregation mode, with and without an entropy bonus (which computes every row)."""
    from rlvr.modeling.loading import load_tokenizer

    batch = _batch(len(load_tokenizer(tiny_model)))
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(2, _free_port(), tiny_model, out), nprocs=2, join=True)
    for agg, entropy in CASES:
        whole, metrics = _one_step(tiny_model, batch, Distributed(), agg, entropy)
        for rank in (0, 1):
            weights, grad_norm = out[(rank, agg, entropy)]
            assert grad_norm == pytest.approx(metrics["train/grad_norm"], rel=1e-5), (agg, entropy)
            for name, value in whole.items():
                torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6, msg=f"{agg} rank {rank}: {name}")
        alone = _one_step(tiny_model, batch.select(torch.arange(4)), Distributed(), agg, entropy)[0]
        assert any(not torch.equal(value, alone[name]) for name, value in whole.items())  # a half alone steps otherwise


def test_a_single_process_is_rank_0_of_1_and_every_collective_is_a_no_op():
    from rlvr.run.runtime import init_distributed

    dist = init_distributed("cpu")
    assert (dist.rank, dist.world_size, dist.is_main) == (0, 1, True)
    assert dist.sum(3.5) == 3.5 and dist.gather("x") == ["x"] and dist.broadcast(7) == 7
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), 2.0)
    dist.sum_gradients([p])
    assert p.grad.tolist() == [2.0, 2.0]

"""Estimators that normalise over the whole batch (REINFORCE++, and its token-level form with a PRM's step
rewards) give every sample the same advantage on 2 ranks, each holding half of the groups, as on one
process holding them all: the batch's mean and std are summed over the ranks (``Distributed.sum_tensor``)."""

import threading

import torch
import torch.multiprocessing as mp

from test_distributed import _free_port
from rlvr.algorithms.advantages import ADVANTAGE_ESTIMATORS, reinforce_pp_advantages, token_return_advantages
from rlvr.run.runtime import Distributed


def _inputs():
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(8, 4, generator=generator)  # [P, G]: 8 groups of 4
    rewards[0] = 1.0  # ranks' halves with different means and spreads
    rewards[5] *= 3.0
    valid = torch.ones(8, 4, dtype=torch.bool)
    valid[2, 1] = valid[6, 3] = False
    dense = torch.randn(32, 5, generator=generator)  # [N, T] step rewards
    mask = (torch.arange(5) < torch.randint(1, 6, (32, 1), generator=generator)).float()
    return rewards, valid, dense, mask


def _rank(rank: int, world: int, port: int, out: dict) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        dist = Distributed(rank=rank, world_size=world)
        rewards, valid, dense, mask = _inputs()
        half, rows = slice(4 * rank, 4 * rank + 4), slice(16 * rank, 16 * rank + 16)  # whole groups per rank
        out[rank] = (reinforce_pp_advantages(rewards[half], valid[half], all_sum=dist.sum_tensor),
                     token_return_advantages(rewards[half].flatten(), dense[rows], mask[rows], valid[half].flatten(),
                                             all_sum=dist.sum_tensor))
    finally:
        torch.distributed.destroy_process_group()


class _ThreadRanks:
    """Two ranks as two threads of this process: ``all_sum`` adds what both pass at the same call (a barrier
    apart), as an all-reduce does. In-process, so the mutation check's mutants reach it."""

    def __init__(self):
        self.barrier, self.parts = threading.Barrier(2), {}

    def all_sum(self, rank: int):
        def add(stats: torch.Tensor) -> torch.Tensor:
            self.parts[rank] = stats.clone()
            self.barrier.wait()
            total = self.parts[0] + self.parts[1]
            self.barrier.wait()  # both have read before the next call writes
            return total
        return add


def test_batch_estimators_give_two_ranks_the_advantages_of_one_process():
    rewards, valid, dense, mask = _inputs()
    ranks, out = _ThreadRanks(), {}

    def rank(r: int) -> None:
        half, rows = slice(4 * r, 4 * r + 4), slice(16 * r, 16 * r + 16)
        out[r] = (reinforce_pp_advantages(rewards[half], valid[half], all_sum=ranks.all_sum(r)),
                  token_return_advantages(rewards[half].flatten(), dense[rows], mask[rows], valid[half].flatten(),
                                          all_sum=ranks.all_sum(r)))

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert torch.equal(torch.cat([out[0][0], out[1][0]]), reinforce_pp_advantages(rewards, valid))
    assert torch.equal(torch.cat([out[0][1], out[1][1]]),
                       token_return_advantages(rewards.flatten(), dense, mask, valid.flatten()))


def test_two_gloo_ranks_sum_the_batch_statistics_with_distributed_sum_tensor():
    rewards, valid, dense, mask = _inputs()
    whole = reinforce_pp_advantages(rewards, valid)
    tokens = token_return_advantages(rewards.flatten(), dense, mask, valid.flatten())
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(2, _free_port(), out), nprocs=2, join=True)
    assert torch.equal(torch.cat([out[0][0], out[1][0]]), whole)
    assert torch.equal(torch.cat([out[0][1], out[1][1]]), tokens)
    local = torch.cat([reinforce_pp_advantages(rewards[:4], valid[:4]), reinforce_pp_advantages(rewards[4:], valid[4:])])
    assert (local - whole).abs().max() > 0.1  # what each rank computed alone before: other advantages


def test_the_batch_estimators_are_marked_and_the_group_ones_are_not():
    assert getattr(ADVANTAGE_ESTIMATORS["reinforce_pp"], "over_the_batch", False)
    for name in ("grpo", "dr_grpo", "rloo"):  # whole groups stay on one rank: nothing to sum
        assert not getattr(ADVANTAGE_ESTIMATORS[name], "over_the_batch", False)

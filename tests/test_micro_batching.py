"""Micro-batches (``rlvr.rollout.batch.MicroBatching``, ``Batch.select(rows, trim=True)``): each one cut to
its own width, and with ``train.micro_batch_tokens`` rows packed by length under a token budget. Only
padding is dropped, so an update's loss and gradient equal the untrimmed whole batch's."""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from rlvr.rollout.batch import Batch, MicroBatching, pack_rows, row_extents

AGGREGATIONS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


def _long_tailed_batch(vocab: int, groups: int = 6, group_size: int = 4, seed: int = 0) -> Batch:
    """``groups`` prompts of 3..8 tokens (left-padded to 8) x ``group_size`` completions of 2..6 tokens,
    except one row of 40: the batch is 40 columns wide for everyone. Advantages of both signs (one
    group all zero: rows the update skips), a masked environment token inside a row, a masked row."""
    g = torch.Generator().manual_seed(seed)
    width, length, n = 8, 40, groups * group_size
    input_ids = torch.randint(3, vocab, (n, width + length), generator=g)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros(n, length)
    for k in range(groups):
        prompt = torch.randint(3, vocab, (width,), generator=g)
        input_ids[k * group_size : (k + 1) * group_size, :width] = prompt  # a group shares its prompt
        attention_mask[k * group_size : (k + 1) * group_size, width - (3 + k % 6) : width] = 1
    for i in range(n):
        k = length if i == 5 else int(torch.randint(2, 7, (1,), generator=g))
        attention_mask[i, width : width + k] = 1
        response_mask[i, :k] = 1
    response_mask[2, 1] = 0  # an environment token: read, not trained on
    response_mask[7] = 0  # a masked sample
    advantages = torch.randn(n, generator=g)
    advantages[group_size : 2 * group_size] = 0.0  # a zero-variance group
    engine_logp = -torch.rand(n, length, generator=g) * response_mask
    batch = Batch(input_ids, attention_mask, response_mask, engine_logp, advantages)
    batch.ref_logp = engine_logp - 0.1 * torch.rand(n, length, generator=g) * response_mask
    return batch


# ---------------------------------------------------------------------------------------------
# Forming micro-batches
# ---------------------------------------------------------------------------------------------


def _cost(batch: Batch, rows: torch.Tensor, cells: bool = False) -> int:
    """Tokens a micro-batch runs once trimmed: rows x (longest prompt + longest completion); with ``cells``
    its rows counted as the shared-prompt forward lays them out: prompts x the most rows of one prompt."""
    back, reach = row_extents(batch.attention_mask[rows], batch.completion_len, batch.response_mask[rows])
    prompts = (rows // 4).tolist()  # _long_tailed_batch: groups of 4 rows
    count = len(set(prompts)) * max(prompts.count(p) for p in prompts) if cells else len(rows)
    return count * (int(back.max()) + max(1, int(reach.max())))


@pytest.mark.parametrize("budget", [1, 30, 64, 100, 400, 10_000])
@pytest.mark.parametrize("cap", [3, 64])
def test_micro_batches_under_a_token_budget_never_exceed_it(budget, cap):
    batch = _long_tailed_batch(vocab=50)
    rows = torch.tensor([0, 1, 2, 3, 5, 6, 7, 9, 12, 13, 17, 20, 21, 22, 23])  # some rows left out (zero advantage)
    micro = MicroBatching(cap, budget).split(batch, rows)
    assert sorted(torch.cat(micro).tolist()) == rows.tolist()  # every row once
    for part in micro:
        assert len(part) <= cap
        assert part.tolist() == sorted(part.tolist())  # batch order: a group's rows side by side
        assert _cost(batch, part, cells=True) <= budget or len(part) == 1  # only a row longer than the budget
        assert _cost(batch, part) <= _cost(batch, part, cells=True)
    if budget >= _cost(batch, rows) and cap >= len(rows):
        assert len(micro) == 1


def test_a_token_budget_packs_the_long_tail_into_few_micro_batches():
    """One 44-token row among 23 short ones (the batch 48 columns wide: 1,152 tokens). By rows of 4, the
    micro-batch holding it pays its length four times; by tokens it goes alone and the short rows share
    narrow micro-batches."""
    batch = _long_tailed_batch(vocab=50)
    rows = torch.arange(len(batch))
    by_rows = MicroBatching(4).split(batch, rows)
    by_tokens = MicroBatching(64, 80).split(batch, rows)
    assert [p.tolist() for p in by_rows] == [p.tolist() for p in rows.split(4)]  # no budget: as before
    assert [5] in [p.tolist() for p in by_tokens]
    assert _cost(batch, rows) == 1152
    assert sum(_cost(batch, p) for p in by_tokens) < sum(_cost(batch, p) for p in by_rows) < 0.4 * 1152


def test_pack_rows_sorts_by_length_and_keeps_ties_in_batch_order():
    distinct = [0, 1, 2, 3]
    assert pack_rows([2, 2, 2, 2], [1, 5, 1, 5], distinct, max_rows=2, max_tokens=100) == [[1, 3], [0, 2]]
    assert pack_rows([2, 2, 2], [1, 1, 1], distinct, max_rows=8, max_tokens=6) == [[0, 1], [2]]  # 2 x 3 fit, 3 x 3 not
    assert pack_rows([1], [50], [0], max_rows=8, max_tokens=10) == [[0]]  # alone over the budget


def test_pack_rows_counts_rows_as_the_shared_prompt_forward_lays_them_out():
    """Prompts A, A, A, B: the shared-prompt forward runs 2 prompts x 3 rows = 6 cells, not 4 rows."""
    lengths, width = [4, 4, 4, 4], [1, 1, 1, 1]
    assert pack_rows(width, lengths, [0, 0, 0, 1], max_rows=8, max_tokens=25) == [[0, 1, 2], [3]]  # 6 x 5 > 25
    assert pack_rows(width, lengths, [0, 0, 1, 1], max_rows=8, max_tokens=20) == [[0, 1, 2, 3]]  # whole groups: 4 x 5
    assert pack_rows(width, lengths, [0, 1, 2, 3], max_rows=8, max_tokens=20) == [[0, 1, 2, 3]]  # distinct: 4 x 5


def test_a_trimmed_micro_batch_has_its_own_width():
    batch = _long_tailed_batch(vocab=50)
    batch.advantages = batch.advantages[:, None] * batch.response_mask  # per-token advantages [N, T] (PPO)
    batch.old_logp, batch.old_values = batch.engine_logp - 1, batch.engine_logp * 2
    batch.returns = batch.engine_logp * 3
    rows = torch.tensor([8, 9, 10])  # the third group: prompts of 5 tokens, completions of <= 6
    micro = batch.select(rows, trim=True)
    back, reach = row_extents(batch.attention_mask[rows], 40, batch.response_mask[rows])
    width, length = int(back.max()), int(reach.max())
    assert (width, length) == (5, max(int(batch.response_mask[r].sum()) for r in rows))
    assert micro.input_ids.shape == micro.attention_mask.shape == (3, width + length)
    assert micro.completion_len == length
    untrimmed = batch.select(rows)
    columns = slice(8 - width, 8 + length)
    assert torch.equal(micro.input_ids, untrimmed.input_ids[:, columns])
    assert torch.equal(micro.attention_mask, untrimmed.attention_mask[:, columns])
    assert untrimmed.attention_mask[:, : 8 - width].sum() == 0 and untrimmed.attention_mask[:, 8 + length :].sum() == 0
    for name in ("response_mask", "engine_logp", "old_logp", "ref_logp", "old_values", "returns", "advantages"):
        assert torch.equal(getattr(micro, name), getattr(untrimmed, name)[:, :length]), name
    assert micro.input_ids.is_contiguous()
    whole = batch.select(torch.tensor([5]), trim=True)  # the 40-token row keeps all its completion
    assert whole.completion_len == 40 and whole.input_ids.shape[1] == int(batch.attention_mask[5].sum())
    assert batch.select(torch.tensor([7]), trim=True).completion_len >= 1  # a masked row keeps its real tokens


def test_the_lockstep_count_is_over_the_packed_micro_batches(monkeypatch):
    """Under FSDP2 a rank fills up to the most micro-batches any rank formed, with zero-weight passes."""
    from rlvr.rollout import batch as batch_module

    batch = _long_tailed_batch(vocab=50)
    rows = torch.arange(len(batch))
    plan = MicroBatching(64, 100)
    own = plan.split(batch, rows)
    seen = []
    monkeypatch.setattr(batch_module, "lockstep_passes", lambda model, count: seen.append(count) or count + 2)
    passes = plan.passes(batch, rows, model=None)
    assert seen == [len(own)] and len(passes) == len(own) + 2 and passes[-2:] == [None, None]
    assert [p.tolist() for p in passes[:-2]] == [p.tolist() for p in own]


# ---------------------------------------------------------------------------------------------
# The same loss and gradient
# ---------------------------------------------------------------------------------------------


def _settings(model_path, agg: str, *extra: str):
    from rlvr.config import RunConfig, build_config
    from rlvr.recipes.update import UpdateSettings

    config = build_config(RunConfig, {"model": {"path": str(model_path)}}, [
        f"algorithm.loss_agg={agg}", "algorithm.beta=0.04", "algorithm.entropy_coef=0.01",
        "generation.max_new_tokens=40", "optim.grad_clip=1e9", *extra])
    return UpdateSettings.from_config(config)


def _policy(model_path, forward: str):
    from rlvr.modeling.fast_forward import use_model_forward
    from rlvr.modeling.loading import load_policy

    torch.manual_seed(0)
    policy = load_policy(model_path)
    if forward == "hf":
        use_model_forward(policy)
    return policy


def _untrimmed_whole_batch(model_path, batch: Batch, agg: str, forward: str) -> tuple[float, torch.Tensor]:
    """The loss and gradient of the batch as one untrimmed micro-batch (the pass before trimming existed)."""
    from rlvr.recipes.update import global_counts, policy_terms
    from rlvr.run.runtime import Distributed

    policy = _policy(model_path, forward)
    s = _settings(model_path, agg)
    part = policy_terms(policy, batch, s, **global_counts(batch, Distributed()))
    part.loss.backward()
    return part.loss.item(), torch.cat([p.grad.flatten() for p in policy.parameters()])


def _update(model_path, batch: Batch, agg: str, forward: str, *extra: str) -> tuple[float, torch.Tensor, list]:
    """``update_policy``'s loss and gradient (SGD at lr 0 keeps the gradient) and its passes' input shapes."""
    from rlvr.recipes import update

    policy = _policy(model_path, forward)
    shapes = []
    original = update.completion_logprobs

    def spy(model, input_ids, attention_mask, completion_len, *args, **kwargs):
        shapes.append((tuple(input_ids.shape), completion_len))
        return original(model, input_ids, attention_mask, completion_len, *args, **kwargs)

    update.completion_logprobs = spy
    try:
        out = update.update_policy(policy, batch, torch.optim.SGD(policy.parameters(), lr=0.0),
                                   _settings(model_path, agg, *extra))
    finally:
        update.completion_logprobs = original
    return out["train/loss"], torch.cat([p.grad.flatten() for p in policy.parameters()]), shapes


def _relative(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("forward", ["auto", "hf"], ids=["rlvr-forward", "model-forward"])
@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_trimmed_and_token_budget_updates_have_the_untrimmed_loss_and_gradient(tiny_model, agg, forward):
    batch = _long_tailed_batch(vocab=40)
    loss, grad = _untrimmed_whole_batch(tiny_model, batch, agg, forward)
    for extra, budget in [(["train.micro_batch_size=4"], None),
                          (["train.micro_batch_tokens=100"], 100),
                          (["train.micro_batch_tokens=100", "train.micro_batch_size=3"], 100)]:
        got_loss, got_grad, shapes = _update(tiny_model, batch, agg, forward, *extra)
        assert _relative(got_loss, loss) < 1e-6, extra
        assert _relative(got_grad, grad) < 1e-6, extra
        assert len(shapes) > 1 and sum(ids[0] * ids[1] for ids, _ in shapes) < 0.4 * 1152  # trimmed: 48 columns before
        assert all(ids[1] - length <= 8 for ids, length in shapes)  # the completion part: the micro-batch's own
        if budget is not None:  # only a row longer than the budget may run past it, alone
            assert all(ids[0] * ids[1] <= budget or ids[0] == 1 for ids, _ in shapes)


def test_no_grad_logprobs_under_a_budget_are_padded_back_to_the_batch(tiny_model):
    from rlvr.modeling.logprobs import completion_logprobs, no_grad_logprobs

    policy = _policy(tiny_model, "auto")
    batch = _long_tailed_batch(vocab=40)
    whole, _ = completion_logprobs(policy, batch.input_ids, batch.attention_mask, batch.completion_len)
    real = batch.attention_mask[:, -batch.completion_len :].bool()
    for plan in (4, MicroBatching(64, 100)):
        logp = no_grad_logprobs(policy, batch, plan, 1.0)
        assert logp.shape == (len(batch), batch.completion_len) and not logp.is_inference()
        torch.testing.assert_close(logp[real], whole.detach()[real], rtol=1e-5, atol=1e-6)
        assert not logp[~real].any()  # padding: 0


# ---------------------------------------------------------------------------------------------
# FSDP2: ranks with different numbers of micro-batches stay in lockstep
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sharded_update(model_path, rows: torch.Tensor, dist, sharded: bool) -> dict[str, torch.Tensor]:
    """One update (SGD) under a token budget of ``rows`` of the long-tailed batch, float64; the weights after it."""
    from rlvr.modeling.loading import load_policy
    from rlvr.recipes.update import update_policy
    from rlvr.run.sharding import shard_model

    torch.manual_seed(0)
    policy = load_policy(model_path).double()
    batch = _long_tailed_batch(vocab=40)
    for name in ("response_mask", "engine_logp", "ref_logp", "advantages"):
        setattr(batch, name, getattr(batch, name).double())
    batch = batch.select(rows)
    if sharded:
        shard_model(policy)
    s = _settings(model_path, "token_mean", "train.micro_batch_tokens=60", "algorithm.entropy_coef=0")
    s = dataclasses.replace(s, dist=dist)
    update_policy(policy, batch, torch.optim.SGD(policy.parameters(), lr=0.5), s)
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in policy.named_parameters()}


def _rank(rank: int, world: int, port: int, model_path, out: dict) -> None:
    from rlvr.run.runtime import Distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        torch.set_num_threads(1)
        rows = torch.arange(0, 8) if rank == 0 else torch.arange(8, 24)  # rank 0 holds the long row
        weights = _sharded_update(model_path, rows, Distributed(rank=rank, world_size=world), sharded=True)
        if rank == 0:
            out.update(weights)
    finally:
        torch.distributed.destroy_process_group()


def test_sharded_ranks_with_different_micro_batch_counts_take_the_one_process_step(tiny_model):
    from rlvr.run.runtime import Distributed

    batch = _long_tailed_batch(vocab=40)
    plan = MicroBatching(64, 60)
    counts = [len(plan.split(batch.select(r), torch.arange(len(r)))) for r in (torch.arange(0, 8), torch.arange(8, 24))]
    assert counts[0] != counts[1]  # the ranks form different numbers of micro-batches
    expected = _sharded_update(tiny_model, torch.arange(24), Distributed(), sharded=False)
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(2, _free_port(), tiny_model, out), nprocs=2)
        sharded = dict(out)
    for name, value in expected.items():  # whole rows against shared prompts: float32 rotary rounding
        torch.testing.assert_close(sharded[name], value, rtol=1e-6, atol=1e-6, msg=name)

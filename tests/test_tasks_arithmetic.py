"""Self-check of the ``arithmetic`` suite (the quickstart's task): gold 1.0, corrupted 0.0, held-out
splits disjoint, and the problems the quickstart and its tests rely on unchanged."""

from __future__ import annotations

import pytest

from rlvr.tasks import get_task
from rlvr.tasks.arithmetic import split_of
from rlvr.verifiers import get_verifier


@pytest.mark.parametrize("options", [{}, {"style": "bare", "max_digits": 1}, {"ops": "+-*", "max_digits": 2}])
@pytest.mark.parametrize("split,size", [("train", 10_000), ("dev", 500), ("test", 500)])
def test_gold_one_corrupted_zero(split, size, options):
    suite = get_task("arithmetic", split=split, **options)
    if options.get("max_digits") == 1 and split != "train":
        size = len(suite)  # a tiny problem space: the held-out split holds all its problems
        assert 0 < size < 500
    assert len(suite) == size
    verifier = get_verifier("numeric")
    assert all(verifier.score(p.solution, p.reference).score == 1.0 for p in suite)
    assert all(verifier.score(str(int(p.reference["answer"]) + 1), p.reference).score == 0.0 for p in suite)
    assert all(split_of(p.meta["a"], p.meta["op"], p.meta["b"]) == split for p in suite)


def test_held_out_problems_never_appear_in_training():
    train = {(p.meta["a"], p.meta["op"], p.meta["b"]) for p in get_task("arithmetic", split="train", max_digits=2)}
    for split in ("dev", "test"):
        held = {(p.meta["a"], p.meta["op"], p.meta["b"]) for p in get_task("arithmetic", split=split, max_digits=2)}
        assert held and not held & train


def test_problems_are_stable():
    """The quickstart's problems: ids, prompts and answers must not drift between versions."""
    p = get_task("arithmetic", split="test")[0]
    assert (p.id, p.reference, p.verifier) == ("arithmetic/test/0", {"answer": str(p.meta["a"] + p.meta["b"])}, "numeric")
    assert p.prompt == [{"role": "user", "content": f"What is {p.meta['a']} + {p.meta['b']}? Reply with the final number only."}]
    bare = get_task("arithmetic", split="train", style="bare", max_digits=1, n=3)
    assert [q.prompt[0]["content"] for q in bare] == [f"{q.meta['a']}+{q.meta['b']}=" for q in bare]
    assert [q.prompt for q in get_task("arithmetic", split="dev", seed=3, n=5)] == \
        [q.prompt for q in get_task("arithmetic", split="dev", seed=3, n=5)]

"""Reward plugins: a completion plus a reference in, a typed :class:`Reward` out.

Imports without torch, so reward work can run in cheap worker processes.

    from rlvr.verifiers import get_verifier
    get_verifier("numeric").score("so the answer is 42", {"answer": "42"}).score  # 1.0
    get_verifier("math").score("... so the answer is \\boxed{42}", {"answer": "42"}).score  # 1.0

Built-ins: ``numeric``, ``math``, ``format``, ``length``, ``repetition``, ``compose``, ``trl``,
``code``, ``countdown``, ``reasoning_gym``, ``judge``
(see docs/verifiers.md). Batches are scored through :class:`verifiers.runner.VerifierRunner`
(worker processes with a hard per-item deadline, a cache, metrics).
"""

from rlvr.verifiers.base import STATUSES, Reward, Verifier, coerce_reward
from rlvr.verifiers.registry import VERIFIERS, describe_verifier, get_verifier, list_verifiers, register_verifier, verifier_factory

# Built-in verifiers register themselves on import.
from rlvr.verifiers import numeric as _numeric  # noqa: E402,F401
from rlvr.verifiers import code as _code  # noqa: E402,F401
from rlvr.verifiers import math as _math  # noqa: E402,F401
from rlvr.verifiers import countdown as _countdown  # noqa: E402,F401
from rlvr.verifiers import format as _format  # noqa: E402,F401
from rlvr.verifiers import shaping as _shaping  # noqa: E402,F401
from rlvr.verifiers import compose as _compose  # noqa: E402,F401
from rlvr.verifiers import trl as _trl  # noqa: E402,F401
from rlvr.verifiers import reasoning_gym as _reasoning_gym  # noqa: E402,F401
from rlvr.verifiers import judge as _judge  # noqa: E402,F401

from rlvr.verifiers.trl import from_trl, register_trl_reward  # noqa: E402

__all__ = [
    "Reward", "STATUSES", "VERIFIERS", "Verifier", "coerce_reward", "describe_verifier", "from_trl", "get_verifier",
    "list_verifiers", "register_trl_reward", "register_verifier", "verifier_factory",
]

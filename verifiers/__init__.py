"""Reward plugins: a completion plus a reference in, a typed :class:`Reward` out.

Imports without torch, so reward work can run in cheap worker processes.

    from verifiers import get_verifier
    get_verifier("numeric").score("so the answer is 42", {"answer": "42"}).score  # 1.0
"""

from verifiers.base import STATUSES, Reward, Verifier
from verifiers.registry import get_verifier, list_verifiers, register_verifier

# Built-in verifiers register themselves on import.
from verifiers import numeric as _numeric  # noqa: E402,F401
from verifiers import math as _math  # noqa: E402,F401

__all__ = ["Reward", "STATUSES", "Verifier", "get_verifier", "list_verifiers", "register_verifier"]

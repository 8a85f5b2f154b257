"""A bounded results cache keyed by (verifier, options, completion, reference).

GRPO samples a group of completions per prompt and short answers repeat often ("42", "\\boxed{3}"),
so the same item is scored many times over a run. Keys are 16-byte BLAKE2 digests, so memory does
not grow with completion length; the cache holds at most ``max_items`` rewards and evicts the
least recently used. Only ``ok`` and ``abstain`` results are stored: a timeout or an error may be
transient (a loaded machine, a killed worker) and is retried the next time.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections import OrderedDict

from rlvr.verifiers.base import Reward

CACHEABLE_STATUSES = ("ok", "abstain")


def spec_key(name: str, options: dict) -> str:
    """A canonical text for a verifier and its options (the same options in any order give the same key)."""
    return name + "\0" + json.dumps(options, sort_keys=True, default=repr, separators=(",", ":"))


def item_key(spec: str, completion: str, reference: dict, context: dict | None = None) -> bytes:
    """16-byte digest of one scoring request (the context, e.g. the prompt, only where the verifier
    takes it: a verifier that ignores it scores the same completion the same way for any prompt)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(spec.encode())
    h.update(b"\0")
    h.update(completion.encode("utf-8", "surrogatepass"))
    h.update(b"\0")
    h.update(json.dumps(reference, sort_keys=True, default=repr, separators=(",", ":")).encode("utf-8", "surrogatepass"))
    if context:
        h.update(b"\0")
        h.update(json.dumps(context, sort_keys=True, default=repr, separators=(",", ":")).encode("utf-8", "surrogatepass"))
    return h.digest()


def copy_reward(reward: Reward) -> Reward:
    """An independent copy, so that a caller editing a returned reward cannot change the cache."""
    return Reward(reward.score, reward.status, dict(reward.components), reward.latency_s, copy.deepcopy(reward.info))


class RewardCache:
    """Thread-safe LRU map from :func:`item_key` to :class:`Reward` (``max_items=0`` disables it)."""

    def __init__(self, max_items: int = 50_000):
        self.max_items = max(0, int(max_items))
        self._data: OrderedDict[bytes, Reward] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: bytes) -> Reward | None:
        if not self.max_items:
            return None
        with self._lock:
            reward = self._data.get(key)
            if reward is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
        return copy_reward(reward)

    def put(self, key: bytes, reward: Reward) -> None:
        if not self.max_items or reward.status not in CACHEABLE_STATUSES:
            return
        stored = copy_reward(reward)
        with self._lock:
            self._data[key] = stored
            self._data.move_to_end(key)
            while len(self._data) > self.max_items:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

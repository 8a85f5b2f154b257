"""Where a judge's verdicts come from: a backend turns chat requests into replies.

A backend is any object with ``complete(requests) -> replies``, one :class:`JudgeReply` per
:class:`JudgeRequest`, in order. It never raises for one failed call: that reply carries ``error``.
It may raise for a broken configuration (no such model folder), which the judge reports as an error
on every sample of the batch.

Two are built in:

* ``http`` (:class:`HTTPJudge`): an OpenAI-compatible ``/chat/completions`` endpoint (vLLM's server,
  SGLang, any hosted API), called from a thread pool of ``max_concurrency`` threads, each call under
  a deadline and retried with exponential backoff on a refused connection, a timeout, HTTP 408, 429
  or 5xx (``Retry-After`` is honoured, capped at 60 s). Other HTTP errors (401, 404, 400) fail at once:
  retrying a bad key or a wrong model name only hides it. Standard library only, so it runs in a
  torch-free verifier worker too.
* ``local``: a causal LM run in this process in batches (``rlvr.modeling.judge_model``), declared by
  the rlvr distribution as an entry point of the group ``rlvr.judge_backends``, so this package never
  imports the trainer. Third-party backends are declared the same way, or named by import path.

:class:`JudgeCache` is the persistent cache in front of any backend: an SQLite file keyed by a hash of
(backend, model, rendered messages, sampling settings). Only successful replies are stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

from rlvr.verifiers.errors import InvalidValueError
from rlvr.verifiers.plugins import Registry

#: HTTP statuses worth another try: the request may succeed later.
RETRY_STATUSES = (408, 409, 425, 429, 500, 502, 503, 504)
MAX_RETRY_AFTER_S = 60.0

JUDGE_BACKENDS: Registry[Any] = Registry("judge backend", entry_point_group="rlvr.judge_backends",
                                        import_paths=True)


@dataclass(frozen=True)
class JudgeRequest:
    """One call to the judge model: chat ``messages`` and the sampling settings."""

    messages: tuple[tuple[str, str], ...]  # ((role, content), ...): hashable, so a batch can share calls
    max_tokens: int = 64
    temperature: float = 0.0
    top_logprobs: int = 0  # > 0: also return the first generated token's top log-probs

    def as_messages(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


@dataclass
class JudgeReply:
    """What came back: the reply ``text``, the first token's ``top_logprobs`` ({token text: log p}) when
    asked for, or ``error`` (and no text) when the call failed for good."""

    text: str = ""
    top_logprobs: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    attempts: int = 1
    cached: bool = False


class JudgeBackend(Protocol):
    model: str

    def complete(self, requests: Sequence[JudgeRequest]) -> list[JudgeReply]: ...


def get_judge_backend(name: str, **options: Any) -> JudgeBackend:
    """Build the backend registered under ``name`` (``http``, ``local``, an entry point or an import path)."""
    if name == "local" and name not in JUDGE_BACKENDS:
        raise InvalidValueError("judge backend 'local' is provided by the rlvr package's entry point "
                                "(rlvr.judge_backends), which is not registered: reinstall rlvr (pip install -e .)")
    factory = JUDGE_BACKENDS.get(name)
    try:
        return factory(**options)
    except TypeError as exc:
        raise InvalidValueError(f"judge backend {name!r} rejected its options {sorted(options)}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# http: an OpenAI-compatible endpoint
# ---------------------------------------------------------------------------------------------


@JUDGE_BACKENDS.register("http")
class HTTPJudge:
    """Chat completions from ``{base_url}/chat/completions``.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (vLLM's ``vllm serve``) or a hosted API's.
        model: the model name the server knows.
        api_key_env: the environment variable holding the key, sent as ``Authorization: Bearer``
            (unset or empty: no header, as local servers expect).
        max_concurrency: calls in flight at once, at most.
        timeout_s: deadline of one attempt, in seconds.
        retries: further attempts after a failed one (a timeout, a refused connection, 408/429/5xx).
        backoff_s: the wait before the first retry; it doubles each time (plus up to 25% jitter).
    """

    def __init__(self, *, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", max_concurrency: int = 8,
                 timeout_s: float = 30.0, retries: int = 3, backoff_s: float = 1.0):
        if not str(base_url).startswith(("http://", "https://")):
            raise InvalidValueError(f"judge base_url must start with http:// or https://, got {base_url!r}")
        if int(max_concurrency) < 1 or not float(timeout_s) > 0 or int(retries) < 0 or float(backoff_s) < 0:
            raise InvalidValueError("judge http backend: max_concurrency >= 1, timeout_s > 0, retries >= 0 and "
                                    "backoff_s >= 0 are required")
        self.url = str(base_url).rstrip("/") + "/chat/completions"
        self.model = str(model)
        self.api_key_env = api_key_env
        self.max_concurrency = int(max_concurrency)
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)

    def complete(self, requests: Sequence[JudgeRequest]) -> list[JudgeReply]:
        if not requests:
            return []
        workers = min(self.max_concurrency, len(requests))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlvr-judge") as pool:
            return list(pool.map(self._call, requests))

    def _call(self, request: JudgeRequest) -> JudgeReply:
        body: dict[str, Any] = {"model": self.model, "messages": request.as_messages(),
                                "max_tokens": request.max_tokens, "temperature": request.temperature}
        if request.top_logprobs:
            body.update(logprobs=True, top_logprobs=request.top_logprobs)
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env or "", "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        error = ""
        for attempt in range(1, self.retries + 2):
            wait = self.backoff_s * 2 ** (attempt - 1) * (1 + 0.25 * random.random())
            try:
                http_request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(http_request, timeout=self.timeout_s) as response:
                    reply = _parse_chat_reply(json.loads(response.read()))
                reply.attempts = attempt
                return reply
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:300].decode("utf-8", "replace").strip().replace("\n", " ")
                error = f"HTTP {exc.code} from {self.url}" + (f": {detail}" if detail else "")
                if exc.code not in RETRY_STATUSES:
                    return JudgeReply(error=error, attempts=attempt)
                retry_after = exc.headers.get("Retry-After") if exc.headers else None
                if retry_after and retry_after.strip().replace(".", "", 1).isdigit():
                    wait = min(float(retry_after), MAX_RETRY_AFTER_S)
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                error = f"{type(exc).__name__} calling {self.url}: {reason}"
            except (ValueError, KeyError, IndexError, TypeError) as exc:  # a 200 that is not a chat completion
                return JudgeReply(error=f"unreadable reply from {self.url}: {type(exc).__name__}: {exc}", attempts=attempt)
            if attempt <= self.retries:
                time.sleep(wait)
        return JudgeReply(error=f"failed after {self.retries + 1} attempts: {error}", attempts=self.retries + 1)


def _parse_chat_reply(payload: dict) -> JudgeReply:
    """The text and the first token's top log-probs of an OpenAI chat completion."""
    choice = payload["choices"][0]
    text = choice["message"].get("content") or ""
    top: dict[str, float] = {}
    content = ((choice.get("logprobs") or {}).get("content")) or []
    if content:
        for item in content[0].get("top_logprobs") or [{"token": content[0]["token"], "logprob": content[0]["logprob"]}]:
            top.setdefault(str(item["token"]), float(item["logprob"]))
    return JudgeReply(text=str(text), top_logprobs=top)


# ---------------------------------------------------------------------------------------------
# The persistent cache
# ---------------------------------------------------------------------------------------------


def default_cache_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlvr" / "judge-cache.sqlite"


class JudgeCache:
    """Replies on disk, keyed by ``sha256(backend, model, messages, max_tokens, temperature, top_logprobs)``.

    SQLite makes every write atomic and lets several processes (torchrun ranks, verifier workers) share
    one file. A sampled judge (``temperature > 0``) is cached too: the key holds the temperature, so the
    same sample is not paid for twice, at the price of one frozen draw per (prompt, settings).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")
        self._db.commit()

    @staticmethod
    def key(backend: str, model: str, request: JudgeRequest) -> str:
        blob = json.dumps([backend, model, request.messages, request.max_tokens, request.temperature,
                           request.top_logprobs], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get_many(self, keys: Sequence[str]) -> dict[str, JudgeReply]:
        found: dict[str, JudgeReply] = {}
        unique = list(dict.fromkeys(keys))
        with self._lock:
            for start in range(0, len(unique), 500):  # SQLite's bound-parameter limit
                chunk = unique[start : start + 500]
                rows = self._db.execute(f"SELECT key, reply FROM replies WHERE key IN ({','.join('?' * len(chunk))})",
                                        chunk).fetchall()
                for key, reply in rows:
                    found[key] = JudgeReply(**json.loads(reply), cached=True)
        return found

    def put_many(self, items: Sequence[tuple[str, JudgeReply]]) -> None:
        rows = [(key, json.dumps({"text": r.text, "top_logprobs": r.top_logprobs})) for key, r in items if r.error is None]
        if not rows:
            return
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO replies (key, reply) VALUES (?, ?)", rows)
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # a verifier is pickled to worker processes: the connection is reopened there
    def __getstate__(self) -> dict:
        return {"path": str(self.path)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])


def cached_complete(backend: JudgeBackend, backend_name: str, cache: JudgeCache | None,
                    requests: Sequence[JudgeRequest]) -> list[JudgeReply]:
    """``backend.complete(requests)`` with ``cache`` in front: each distinct request not in the cache is
    sent once (duplicates in one batch share a call), and its successful reply is stored."""
    keys = [JudgeCache.key(backend_name, backend.model, r) for r in requests]
    found = cache.get_many(keys) if cache is not None else {}
    todo = list(dict.fromkeys(k for k in keys if k not in found))
    if todo:
        by_key = dict(zip(keys, requests))
        fresh = backend.complete([by_key[k] for k in todo])
        if len(fresh) != len(todo):
            raise RuntimeError(f"judge backend {backend_name!r} returned {len(fresh)} replies for {len(todo)} requests")
        fresh_by_key = dict(zip(todo, fresh))
        if cache is not None:
            cache.put_many(list(fresh_by_key.items()))
        found.update(fresh_by_key)
    return [found[k] for k in keys]

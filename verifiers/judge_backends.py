"""Where a judge's verdicts come from: a backend turns chat requests into replies.

A backend is any object with ``complete(requests) -> replies``, one :class:`JudgeReply` per
:class:`JudgeRequest`, in order. It never raises for one failed call: that reply carries ``error``,
and only that item of the batch becomes ``error``. It may raise for a broken configuration, which the
judge reports as an error on every sample of the batch. A backend class may also offer
``validate(**options)`` (a classmethod: check every option without building anything; the judge calls
it when it is built, so a bad value fails at config load) and ``preflight()`` (a cheap check that it
can work, e.g. that the server answers; the trainer and ``rlvr eval`` call it before any model loads).

Two are built in:

* ``http`` (:class:`HTTPJudge`): an OpenAI-compatible ``/chat/completions`` endpoint (vLLM's server,
  SGLang, any hosted API), called from ``max_concurrency`` daemon threads. Each attempt has a real
  deadline, ``timeout_s``, for the whole exchange (connect, send, status line, headers and every read
  of the body: a server that trickles its reply is cut at the deadline), and is retried with
  exponential backoff on a refused or dropped connection, a timeout, a reply that is not HTTP or is
  cut short, HTTP 408, 429 or 5xx. ``Retry-After`` is honoured up to ``max_retry_after_s``; a server
  that asks for more fails that item at once, saying so. Other HTTP errors (401, 404, 400) fail at
  once: retrying a bad key or a wrong model name only hides it. ``batch_timeout_s`` bounds a whole
  batch. Standard library only, so it runs in a torch-free verifier worker too.
* ``local``: a causal LM run in this process in batches (``rlvr.modeling.judge_model``), declared by
  the rlvr distribution as an entry point of the group ``rlvr.judge_backends``, so this package never
  imports the trainer. Third-party backends are declared the same way, or named by import path.

:class:`JudgeCache` is the persistent cache in front of any backend: an SQLite file keyed by a hash of
(backend, endpoint, model, rendered messages, sampling settings). Only successful replies are stored.
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import http.client
import ipaddress
import json
import math
import os
import random
import socket
import sqlite3
import ssl
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

from rlvr.verifiers.errors import InvalidValueError
from rlvr.verifiers.plugins import Registry
from rlvr.verifiers.threads import run_with_deadlines

#: HTTP statuses worth another try: the request may succeed later.
RETRY_STATUSES = (408, 409, 425, 429, 500, 502, 503, 504)
#: The longest reply body read from a judge server (a chat completion of a few tokens is a few KB;
#: a server that sends more is broken, and the call fails instead of filling memory).
MAX_REPLY_BYTES = 4 << 20
#: The seconds ``preflight`` waits for the judge server before the run starts, at most.
PREFLIGHT_TIMEOUT_S = 5.0

JUDGE_BACKENDS: Registry[Any] = Registry("judge backend", entry_point_group="rlvr.judge_backends",
                                        import_paths=True)


# ---------------------------------------------------------------------------------------------
# Option checks shared by the judge and its backends: one line naming the option and its range
# ---------------------------------------------------------------------------------------------


def check_integer(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, else :class:`InvalidValueError` naming judge option ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidValueError(f"judge option {name} must be an integer >= {minimum}, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number != int(number) or int(number) < minimum:
        raise InvalidValueError(f"judge option {name} must be an integer >= {minimum}, got {value!r}")
    return int(number)


def check_real(name: str, value: Any, minimum: float, *, above: bool = False) -> float:
    """``value`` as a finite float ``>= minimum`` (``> minimum`` with ``above``), else one line naming ``name``."""
    bound = f"{'>' if above else '>='} {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidValueError(f"judge option {name} must be a number {bound}, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < minimum or (above and number == minimum):
        raise InvalidValueError(f"judge option {name} must be a finite number {bound}, got {value!r}")
    return number


def check_flag(name: str, value: Any) -> bool:
    """``value`` as a bool (true/false), else one line naming ``name``."""
    if not isinstance(value, bool):
        raise InvalidValueError(f"judge option {name} must be true or false, got {value!r}")
    return value


def is_local_host(host: str) -> bool:
    """True for this machine's own names: ``localhost`` (and ``*.localhost``), 127.0.0.0/8 and ::1."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ranks() -> int:
    """The number of processes of this run (torchrun's ``WORLD_SIZE``; 1 outside torchrun)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1


def per_rank_concurrency(max_concurrency: int) -> int:
    """This process's share of ``max_concurrency``: the limit is for the whole run, so under torchrun
    each of the ``WORLD_SIZE`` ranks keeps ``max_concurrency // WORLD_SIZE`` calls in flight (at least 1)."""
    return max(1, int(max_concurrency) // ranks())


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


def judge_backend_factory(name: str) -> Any:
    """The class (or factory) registered as judge backend ``name``; one line listing the valid ones if none is."""
    if name == "local" and name not in JUDGE_BACKENDS:
        raise InvalidValueError("judge backend 'local' is provided by the rlvr package's entry point "
                                "(rlvr.judge_backends), which is not registered: reinstall rlvr (pip install -e .)")
    if not isinstance(name, str) or name not in JUDGE_BACKENDS:
        valid = ", ".join(JUDGE_BACKENDS.names()) or "http"
        raise InvalidValueError(f"judge option backend {name!r} is unknown; valid backends: {valid}, or an import "
                                "path 'package.module:Class'")
    return JUDGE_BACKENDS.get(name)


def validate_backend_options(name: str, **options: Any) -> None:
    """Check backend ``name``'s options without building it: unknown options, and bad values where the
    backend offers ``validate(**options)``. One line naming the option."""
    from rlvr.verifiers.plugins import check_options

    factory = judge_backend_factory(name)
    check_options(f"judge backend {name!r}", factory, options)
    validate = getattr(factory, "validate", None)
    if callable(validate):
        try:
            validate(**options)
        except InvalidValueError:
            raise
        except (TypeError, ValueError) as exc:
            raise InvalidValueError(f"judge backend {name!r} rejected its options {sorted(options)}: {exc}") from exc


def get_judge_backend(name: str, **options: Any) -> JudgeBackend:
    """Build the backend registered under ``name`` (``http``, ``local``, an entry point or an import path)."""
    from rlvr.verifiers.plugins import build_with_options

    return build_with_options(f"judge backend {name!r}", judge_backend_factory(name), options)


# ---------------------------------------------------------------------------------------------
# http: an OpenAI-compatible endpoint
# ---------------------------------------------------------------------------------------------


class _Expired(Exception):
    """The attempt's deadline passed (raised between reads; the watchdog cuts a blocked one)."""


@JUDGE_BACKENDS.register("http")
class HTTPJudge:
    """Chat completions from ``{base_url}/chat/completions``.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (vLLM's ``vllm serve``) or a hosted API's; http or https.
        model: the model name the server knows.
        api_key_env: the environment variable holding the key, sent as ``Authorization: Bearer``
            (unset or empty: no header, as local servers expect). A key is never sent over plain
            ``http://`` to a host other than this machine unless ``allow_insecure_key`` is true.
        max_concurrency: calls in flight at once, at most, for the whole run: under torchrun each of
            the ``WORLD_SIZE`` ranks keeps ``max_concurrency // WORLD_SIZE`` (at least 1).
        timeout_s: the deadline of one attempt, connect to the last byte of the reply.
        retries: further attempts after a failed one (a timeout, a refused or dropped connection, a
            reply that is not HTTP or is cut short, 408/429/5xx).
        backoff_s: the wait before the first retry; it doubles each time (plus up to 25% jitter).
        max_retry_after_s: the longest ``Retry-After`` honoured; a server asking for more fails the item.
        batch_timeout_s: the deadline of a whole batch (None: none beyond each call's own); calls still
            running or not started at it end as ``error``.
        allow_insecure_key: send the key over plain ``http://`` to another host (it travels readable).
    """

    def __init__(self, *, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", max_concurrency: int = 8,
                 timeout_s: float = 30.0, retries: int = 3, backoff_s: float = 1.0, max_retry_after_s: float = 60.0,
                 batch_timeout_s: float | None = None, allow_insecure_key: bool = False):
        checked = self.validate(base_url=base_url, model=model, api_key_env=api_key_env,
                                max_concurrency=max_concurrency, timeout_s=timeout_s, retries=retries,
                                backoff_s=backoff_s, max_retry_after_s=max_retry_after_s,
                                batch_timeout_s=batch_timeout_s, allow_insecure_key=allow_insecure_key)
        self.base_url = checked["base_url"]
        self.endpoint = self.base_url  # part of the cache key: two servers never share verdicts
        self.url = self.base_url + "/chat/completions"
        parts = urllib.parse.urlsplit(self.url)
        self.scheme, self.host, self.port = parts.scheme, parts.hostname or "", parts.port
        self.path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.model = str(model)
        self.api_key_env = checked["api_key_env"]
        self.allow_insecure_key = checked["allow_insecure_key"]
        self.max_concurrency = per_rank_concurrency(checked["max_concurrency"])
        self.timeout_s = checked["timeout_s"]
        self.retries = checked["retries"]
        self.backoff_s = checked["backoff_s"]
        self.max_retry_after_s = checked["max_retry_after_s"]
        self.batch_timeout_s = checked["batch_timeout_s"]

    @classmethod
    def validate(cls, *, base_url: Any = None, model: Any = None, api_key_env: Any = "OPENAI_API_KEY",
                 max_concurrency: Any = 8, timeout_s: Any = 30.0, retries: Any = 3, backoff_s: Any = 1.0,
                 max_retry_after_s: Any = 60.0, batch_timeout_s: Any = None, allow_insecure_key: Any = False) -> dict:
        """Every option checked (nothing is contacted): the values as used, or one line naming the bad one."""
        if not base_url or not isinstance(base_url, str):
            raise InvalidValueError("judge backend http needs option base_url (e.g. http://127.0.0.1:8000/v1)")
        parts = urllib.parse.urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidValueError(f"judge option base_url must be an http:// or https:// URL with a host (e.g. "
                                    f"http://127.0.0.1:8000/v1), got {base_url!r}")
        try:
            parts.port
        except ValueError:
            raise InvalidValueError(f"judge option base_url has an invalid port: {base_url!r}") from None
        if not model or not isinstance(model, str):
            raise InvalidValueError(f"judge option model must be the model name the server knows, got {model!r}")
        if api_key_env is not None and not isinstance(api_key_env, str):
            raise InvalidValueError(f"judge option api_key_env must name an environment variable, got {api_key_env!r}")
        checked = {
            "base_url": base_url.strip().rstrip("/"),
            "api_key_env": api_key_env or "",
            "max_concurrency": check_integer("max_concurrency", max_concurrency, 1),
            "timeout_s": check_real("timeout_s", timeout_s, 0, above=True),
            "retries": check_integer("retries", retries, 0),
            "backoff_s": check_real("backoff_s", backoff_s, 0),
            "max_retry_after_s": check_real("max_retry_after_s", max_retry_after_s, 0),
            "batch_timeout_s": None if batch_timeout_s is None else check_real("batch_timeout_s", batch_timeout_s, 0,
                                                                               above=True),
            "allow_insecure_key": check_flag("allow_insecure_key", allow_insecure_key),
        }
        key = os.environ.get(checked["api_key_env"], "") if checked["api_key_env"] else ""
        if key and parts.scheme == "http" and not is_local_host(parts.hostname) and not checked["allow_insecure_key"]:
            raise InvalidValueError(
                f"judge option base_url {base_url!r} is plain http to another host, and ${checked['api_key_env']} holds "
                "an API key that would travel readable: use https://, or set api_key_env: '' to send no key, or "
                "allow_insecure_key: true to send it anyway")
        return checked

    # ------------------------------------------------------------------ a batch
    def complete(self, requests: Sequence[JudgeRequest]) -> list[JudgeReply]:
        """One reply per request, at most ``max_concurrency`` calls in flight, in daemon threads: a
        Ctrl-C (or any exception) in the caller returns at once, leaving the calls in flight to end at
        their own deadline; at ``batch_timeout_s`` the unfinished items are errors."""
        if not requests:
            return []
        deadline = None if self.batch_timeout_s is None else time.monotonic() + self.batch_timeout_s
        late = f"no reply within the batch deadline (batch_timeout_s={self.batch_timeout_s:g})" if deadline else ""
        outcomes = run_with_deadlines([functools.partial(self._call, request, deadline) for request in requests],
                                      None, workers=min(self.max_concurrency, len(requests)), name="rlvr-judge",
                                      deadline=deadline)
        return [JudgeReply(error=late, attempts=0) if outcome.timed_out else outcome.value if outcome.error is None
                else JudgeReply(error=f"judge call raised {type(outcome.error).__name__}: {outcome.error}")
                for outcome in outcomes]  # a fault stays with its own item

    # ------------------------------------------------------------------ one call
    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        if key:
            if self.scheme == "http" and not is_local_host(self.host) and not self.allow_insecure_key:
                raise InvalidValueError(f"refusing to send ${self.api_key_env} over plain http to {self.host} "
                                        "(set allow_insecure_key: true, or use https://)")
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _call(self, request: JudgeRequest, batch_deadline: float | None = None) -> JudgeReply:
        """One request, retried; never raises: a failure is the reply's ``error``."""
        body: dict[str, Any] = {"model": self.model, "messages": request.as_messages(),
                                "max_tokens": request.max_tokens, "temperature": request.temperature}
        if request.top_logprobs:
            body.update(logprobs=True, top_logprobs=request.top_logprobs)
        data = json.dumps(body).encode()
        try:
            headers = self._headers()
        except InvalidValueError as exc:
            return JudgeReply(error=str(exc), attempts=0)
        error, attempt = "", 0
        for attempt in range(1, self.retries + 2):
            wait = self.backoff_s * 2 ** (attempt - 1) * (1 + 0.25 * random.random())
            deadline = time.monotonic() + self.timeout_s
            if batch_deadline is not None:
                deadline = min(deadline, batch_deadline)
            try:
                status, reply_headers, raw = self._exchange("POST", self.path, data, headers, deadline)
            except _Expired as exc:
                error = f"no complete reply from {self.url} within timeout_s={self.timeout_s:g} ({exc})"
            except (OSError, http.client.HTTPException) as exc:  # refused, reset, not HTTP, cut short, TLS
                error = f"{type(exc).__name__} calling {self.url}: {exc or 'connection closed'}"
            else:
                if 200 <= status < 300:
                    try:
                        reply = _parse_chat_reply(json.loads(raw))
                    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                        return JudgeReply(error=f"unreadable reply from {self.url}: {type(exc).__name__}: {exc}",
                                          attempts=attempt)
                    reply.attempts = attempt
                    return reply
                detail = raw[:300].decode("utf-8", "replace").strip().replace("\n", " ")
                error = f"HTTP {status} from {self.url}" + (f": {detail}" if detail else "")
                if status not in RETRY_STATUSES:
                    return JudgeReply(error=error, attempts=attempt)
                asked = _retry_after_s(reply_headers.get("Retry-After"))
                if asked is not None and attempt <= self.retries:
                    if asked > self.max_retry_after_s:
                        return JudgeReply(error=f"{error}; the server asked to retry after {asked:g} s, more than "
                                          f"max_retry_after_s={self.max_retry_after_s:g} (raise it to wait that long)",
                                          attempts=attempt)
                    wait = asked
            if attempt > self.retries:
                break
            if batch_deadline is not None and time.monotonic() + wait >= batch_deadline:
                return JudgeReply(error=f"{error}; not retried: waiting {wait:.3g} s would pass the batch deadline "
                                  f"(batch_timeout_s={self.batch_timeout_s:g})", attempts=attempt)
            time.sleep(wait)
        return JudgeReply(error=f"failed after {attempt} attempts: {error}", attempts=attempt)

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        """A connection to the server, or through the proxy the environment names (``https_proxy``,
        ``http_proxy``, ``no_proxy``, as urllib reads them)."""
        default_port = 443 if self.scheme == "https" else 80
        port = self.port or default_port
        proxy = urllib.request.getproxies().get(self.scheme)
        if proxy and urllib.request.proxy_bypass(f"{self.host}:{port}"):
            proxy = None
        if proxy:
            proxy_parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            target = (proxy_parts.hostname or "", proxy_parts.port or 80)
        else:
            target = (self.host, port)
        if self.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                *target, timeout=timeout, context=ssl.create_default_context())
            if proxy:
                conn.set_tunnel(self.host, port)
        else:
            conn = http.client.HTTPConnection(*target, timeout=timeout)
        conn._rlvr_via_proxy = bool(proxy) and self.scheme == "http"  # type: ignore[attr-defined]
        return conn

    def _exchange(self, method: str, path: str, data: bytes | None, headers: dict[str, str],
                  deadline: float) -> tuple[int, Any, bytes]:
        """``(status, headers, body)`` of one HTTP exchange that ends by ``deadline`` (a monotonic time).

        Socket operations time out at the time left; a watchdog shuts the socket at the deadline, which
        ends a read blocked inside the status line or the headers (where no check can run between
        reads); the body is read in chunks with the deadline checked between them, and capped at
        :data:`MAX_REPLY_BYTES`. The name lookup is the one step no timeout covers."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Expired("no time left")
        conn = self._connection(left)
        fired = threading.Event()

        def cut() -> None:  # the watchdog: a blocked recv returns at once
            fired.set()
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        watchdog = threading.Timer(left, cut)
        watchdog.daemon = True
        watchdog.start()
        try:
            try:
                target = f"{self.scheme}://{self.host}{f':{self.port}' if self.port else ''}{path}" \
                    if getattr(conn, "_rlvr_via_proxy", False) else path
                conn.request(method, target, body=data, headers=headers)
                sock = conn.sock  # the response may take it over (and conn.sock become None)
                _settimeout(sock, deadline)
                response = conn.getresponse()
                chunks, size = [], 0
                while True:
                    if time.monotonic() >= deadline:
                        raise _Expired("the reply was still arriving")
                    _settimeout(sock, deadline)
                    chunk = response.read1(65536)
                    if not chunk:
                        if response.length:  # the connection ended before the promised Content-Length
                            raise http.client.IncompleteRead(b"".join(chunks), response.length)
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_REPLY_BYTES:
                        raise http.client.HTTPException(f"reply larger than {MAX_REPLY_BYTES} bytes")
                return response.status, response.headers, b"".join(chunks)
            except (OSError, http.client.HTTPException) as exc:
                if fired.is_set() or time.monotonic() >= deadline:
                    raise _Expired(f"{type(exc).__name__} at the deadline") from exc
                raise
        finally:
            watchdog.cancel()
            conn.close()

    # ------------------------------------------------------------------ before the run
    def preflight(self, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> None:
        """One line (:class:`InvalidValueError`) naming ``base_url`` and the error when the server cannot be
        reached: ``GET {base_url}/models`` within ``min(timeout_s, self.timeout_s)``. Any HTTP answer,
        even an error status, shows the server is there."""
        deadline = time.monotonic() + min(timeout_s, self.timeout_s)
        try:
            headers = self._headers()
            headers.pop("Content-Type", None)
            self._exchange("GET", self.path.rsplit("/chat/completions", 1)[0] + "/models", None, headers, deadline)
        except _Expired:
            raise InvalidValueError(f"judge base_url {self.base_url} did not answer within "
                                    f"{min(timeout_s, self.timeout_s):g} s (checked before the run; start the server, "
                                    "fix base_url, or set check_server: false to skip this check)") from None
        except (OSError, http.client.HTTPException) as exc:
            raise InvalidValueError(f"judge base_url {self.base_url} cannot be reached: {type(exc).__name__}: "
                                    f"{exc or 'connection closed'} (checked before the run; start the server, fix "
                                    "base_url, or set check_server: false to skip this check)") from None


def _settimeout(sock: socket.socket | None, deadline: float) -> None:
    if sock is not None:
        sock.settimeout(max(1e-3, deadline - time.monotonic()))


def _retry_after_s(value: str | None) -> float | None:
    """The seconds a ``Retry-After`` header asks for (a number or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


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
    """Replies on disk, keyed by ``sha256(backend, endpoint, model, messages, max_tokens, temperature,
    top_logprobs)``; the endpoint is the server's ``base_url`` (``http``), so two servers that serve a
    model under the same name never share verdicts.

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
    def key(backend: str, model: str, request: JudgeRequest, endpoint: str = "") -> str:
        blob = json.dumps([backend, endpoint, model, request.messages, request.max_tokens, request.temperature,
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
    endpoint = str(getattr(backend, "endpoint", "") or "")
    keys = [JudgeCache.key(backend_name, backend.model, r, endpoint) for r in requests]
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

"""A stand-in judge for tests: an OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1.

Its "model" is a rule (``grade(user_text) -> reply text``), and the server records what a real one
would cost: every request body, how many were in flight at once, and it can fail or stall on demand,
and misbehave as a broken server or network does (``misbehave``): cut a reply mid-body, answer with
something that is not HTTP, close without a word, or trickle the body or the headers a byte at a time.
:func:`recency_grader` imitates a judge that obeys the most recent instruction it read: it grades
honestly (the response's last integer against the reference) unless an instruction to say yes comes
after the grader's own request for a verdict, which is how a weak judge falls for prompt injection.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

_TAGGED = re.compile(r"<(response-[0-9a-f]+)>\n(.*)\n</\1>", re.DOTALL)
_INJECTED = re.compile(r"(answer|reply|say|output)\s+\W*(verdict:\s*)?yes|verdict:\s*yes|response above is correct",
                       re.IGNORECASE)
_ASKS = re.compile(r'Reply with one line: "Verdict: yes" or "Verdict: no"\.')


def recency_grader(user: str) -> str:
    """ "Verdict: yes|no" as a recency-biased judge would say it (see the module docstring)."""
    asks = [m.end() for m in _ASKS.finditer(user)]
    unasked = _ASKS.sub(lambda m: " " * len(m.group()), user)  # the grader's own "Verdict: yes" is no injection
    injected = [m.end() for m in _INJECTED.finditer(unasked)]
    if injected and (not asks or max(injected) > max(asks)):
        return "Verdict: yes"
    tagged = _TAGGED.search(user)
    response = tagged.group(2) if tagged else user.split("Response:", 1)[-1]
    reference = re.search(r"Reference answer:\n(.+)", user) or re.search(r"Reference: (.+)", user)
    numbers = re.findall(r"-?\d+", response)
    right = bool(numbers and reference and numbers[-1] == reference.group(1).strip())
    return "Verdict: yes" if right else "Verdict: no"


class FakeJudgeServer:
    """``with FakeJudgeServer(grade) as judge: judge.url`` (``http://127.0.0.1:PORT/v1``).

    Args:
        grade: the user message's text -> the reply text.
        delay_s: how long each call takes.
        fail: ``fail(call_index, user_text) -> HTTP status or None``; a status answers the call with that error.
        top_logprobs: ``top_logprobs(user_text) -> {token: logprob}`` for requests that ask for log-probs.
        retry_after: the ``Retry-After`` header sent with a ``fail`` status (None: none).
        misbehave: ``misbehave(call_index, user_text) -> mode or None``: ``"cut"`` (the headers promise the
            whole body, half of it is sent, the connection closes), ``"not-http"`` (a line that is no HTTP
            status line), ``"close"`` (the connection closes with no reply), ``"trickle"`` (the body one
            byte every ``trickle_s``), ``"trickle-headers"`` (the status line, then the headers one byte
            every ``trickle_s``).
        trickle_s: the pause between trickled bytes.

    ``GET /v1/models`` answers the model list (what a judge's preflight asks for); ``requests`` counts
    every request, GETs included, and ``bodies`` holds the chat requests.
    """

    def __init__(self, grade: Callable[[str], str] = recency_grader, *, delay_s: float = 0.0,
                 fail: Callable[[int, str], int | None] | None = None,
                 top_logprobs: Callable[[str], dict[str, float]] | None = None, retry_after: str | None = None,
                 misbehave: Callable[[int, str], str | None] | None = None, trickle_s: float = 0.3):
        self.grade, self.delay_s, self.fail, self.top_logprobs = grade, delay_s, fail, top_logprobs
        self.retry_after, self.misbehave, self.trickle_s = retry_after, misbehave, trickle_s
        self.bodies: list[dict] = []
        self.gets: list[str] = []
        self.headers: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def handle(self):
                try:
                    super().handle()
                except OSError:  # the client hung up (a judge that gave up on a trickle): nothing to answer
                    pass

            def do_GET(self):
                with server.lock:
                    server.gets.append(self.path)
                data = json.dumps({"object": "list", "data": [{"id": "fake-judge", "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def misbehave(self, mode: str, data: bytes) -> None:
                """Answer as a broken server or network would (see the class docstring)."""
                if mode == "not-http":
                    self.wfile.write(b"SSH-2.0-OpenSSH_9.6 hello\r\n")
                elif mode == "cut":
                    self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                     + str(len(data)).encode() + b"\r\n\r\n" + data[: len(data) // 2])
                elif mode in ("trickle", "trickle-headers"):
                    head = (b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                            + str(len(data)).encode() + b"\r\nX-Padding: " + b"x" * 64 + b"\r\n\r\n")
                    if mode == "trickle":
                        self.wfile.write(head)
                        slow, data = data, b""
                    else:
                        self.wfile.write(head[:17])
                        slow = head[17:] + data
                    for k in range(len(slow)):
                        self.wfile.write(slow[k : k + 1])
                        self.wfile.flush()
                        time.sleep(server.trickle_s)
                elif mode != "close":
                    raise ValueError(f"unknown misbehaviour {mode!r}")
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    index = len(server.bodies)
                    server.bodies.append(body)
                    server.headers.append(dict(self.headers))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(server.delay_s)
                    user = body["messages"][-1]["content"]
                    status = server.fail(index, user) if server.fail else None
                    if status:
                        self.send_response(status)
                        if server.retry_after is not None:
                            self.send_header("Retry-After", server.retry_after)
                        self.end_headers()
                        self.wfile.write(b'{"error": "injected failure"}')
                        return
                    choice = {"index": 0, "message": {"role": "assistant", "content": server.grade(user)},
                              "finish_reason": "stop"}
                    if body.get("logprobs") and server.top_logprobs:
                        top = server.top_logprobs(user)
                        first = max(top, key=top.get)
                        choice["logprobs"] = {"content": [{"token": first, "logprob": top[first], "top_logprobs": [
                            {"token": t, "logprob": v} for t, v in top.items()]}]}
                    data = json.dumps({"choices": [choice], "model": body.get("model")}).encode()
                    mode = server.misbehave(index, user) if server.misbehave else None
                    if mode:
                        self.misbehave(mode, data)
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    with server.lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        # a short poll interval: shutdown() waits up to one interval, which every test would pay
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def calls(self) -> int:
        with self.lock:
            return len(self.bodies)

    def __enter__(self) -> "FakeJudgeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

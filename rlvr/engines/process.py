"""The HF engine in a process of its own: generation that can run while the trainer updates.

    engine = ProcessEngine(path, tokenizer, dtype="float32", threads=1)
    engine.update_weights(iter_inference_weights(policy))    # publication 1: a copy goes to the worker
    ticket = engine.submit(prompts, n, sampling, seed=7)       # returns at once
    ...                                                        # the trainer updates meanwhile
    groups, info = engine.result(ticket)                       # info: the publication that sampled them

The worker (a spawned process) holds its own copy of the model and an :class:`~rlvr.engines.hf.HFEngine`
over it, and serves one FIFO queue of requests: weight publications and generations, in the order they
were sent, so a generation submitted after publication ``v`` is sampled by exactly publication ``v``
(which makes an asynchronous run as reproducible as a synchronous one). ``generate`` (the
:class:`~rlvr.engines.base.Engine` protocol) is a submit and a wait that hands the trainer's torch RNG
state to the worker and takes back the state after sampling, so a run that waits for each generation
draws exactly the samples the in-process HF engine would.

Every wait has a deadline (``timeout_s``): a worker that hangs (a weight publication that never lands,
a deadlock) ends the run with :class:`GeneratorTimeout`, naming the deadline, instead of stalling it.
A worker that raises sends its traceback back, re-raised in the trainer as :class:`GeneratorError`.
"""

from __future__ import annotations

import os
import queue
import time
import traceback
from typing import Any, Iterable, Sequence

import torch

from rlvr.engines.base import Completion, SamplingParams, eos_token_ids
from rlvr.verifiers.errors import UserError


class GeneratorTimeout(UserError, TimeoutError):
    """The generator process did not answer within its deadline."""


class GeneratorError(RuntimeError):
    """The generator process failed; the message holds its traceback."""


class ProcessEngine:
    """An HF engine in a worker process (module docstring); ``weight_sync = "merged"``.

    Args:
        path: the model folder the worker loads (its architecture; the weights come from publications).
        tokenizer: the model's tokenizer (pad and eos ids).
        dtype: the worker's weights dtype.
        threads: torch threads of the worker.
        max_batch_size: sequences generated together.
        timeout_s: the longest wait for the worker to start or to answer a request.
        episodes: to play multi-turn episodes in the worker (``submit(..., problems=...)``): the trainer's
            :class:`~rlvr.rollout.episodes.EpisodeRunner` settings, ``{"environments", "default",
            "max_turns", "max_episode_tokens", "workers", "messages", "eos_ids"}`` (the environments
            are pickled, so their classes must be importable).
    """

    weight_sync = "merged"

    def __init__(self, path: str, tokenizer, *, dtype: str = "float32", threads: int = 1, max_batch_size: int = 256,
                 timeout_s: float = 300.0, episodes: dict[str, Any] | None = None):
        import torch.multiprocessing as mp

        self.timeout_s = timeout_s
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        context = mp.get_context("spawn")  # a fork would copy the trainer's threads and locks
        self._requests, self._replies = context.Queue(), context.Queue()
        spec = {"path": str(path), "dtype": dtype, "threads": threads, "max_batch_size": max_batch_size,
                "episodes": episodes}
        self._process = context.Process(target=_serve, args=(spec, self._requests, self._replies), daemon=True,
                                        name="rlvr-generator")
        self._process.start()
        self.publications = 0  # weight publications sent; the worker serves them in order
        self._next_ticket = 0
        self._done: dict[int, tuple[list[list[Completion]], dict[str, Any]]] = {}
        self._wait(-1, "start (load the model)")

    # ---- the Engine protocol ----------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Publish the weights: copied now (the trainer goes on changing its own), sent to the worker,
        which takes them before any request sent after this call."""
        weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in named_tensors}
        self.publications += 1
        self._send("weights", None, {"weights": weights, "publication": self.publications})

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        """Generate and wait, continuing the trainer's torch RNG stream (see the module docstring)."""
        ticket = self.submit(prompts, n, sampling, rng=torch.get_rng_state())
        groups, info = self.result(ticket)
        torch.set_rng_state(info["rng"])
        return groups

    # ---- asynchronous use -------------------------------------------------------------------

    def submit(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams, *,
               rng: torch.Tensor | None = None, seed: int | None = None, problems: Sequence[Any] | None = None,
               templates: Sequence[Any] | None = None) -> int:
        """Queue a generation (sampled with torch RNG state ``rng``, or seeded with ``seed``); returns
        its ticket at once. With ``problems`` (and the chat ``templates`` their prompts are rendered
        with), the worker plays them as multi-turn episodes."""
        ticket = self._next_ticket
        self._next_ticket += 1
        self._send("generate", ticket, {"prompts": [list(p) for p in prompts], "n": n, "sampling": sampling,
                                        "rng": rng, "seed": seed, "problems": problems, "templates": templates})
        return ticket

    def result(self, ticket: int) -> tuple[list[list[Completion]], dict[str, Any]]:
        """The groups of ``ticket`` and ``info``: ``publication`` (the weights that sampled them),
        ``seconds`` (the worker's generation time), ``idle_s`` (how long the worker waited for this
        request), ``rng`` (its RNG state after sampling)."""
        if ticket not in self._done:
            self._wait(ticket, f"generation {ticket} (after weight publication {self.publications})")
        return self._done.pop(ticket)

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._requests.put(("stop", None, None))
                self._process.join(timeout=10)
            finally:
                if self._process.is_alive():
                    self._process.kill()
                    self._process.join(timeout=10)

    # ---- plumbing -----------------------------------------------------------------------------

    def _send(self, kind: str, ticket: int | None, payload: Any) -> None:
        if not self._process.is_alive():
            raise GeneratorError(f"the generator process has exited (code {self._process.exitcode})")
        self._requests.put((kind, ticket, payload))

    def _wait(self, ticket: int, what: str) -> None:
        """Take replies until ``ticket``'s has come, within ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        while ticket not in self._done:
            remaining = deadline - time.monotonic()
            try:
                kind, got, payload = self._replies.get(timeout=max(remaining, 0.0)) if remaining > 0 else \
                    self._replies.get_nowait()
            except queue.Empty:
                if not self._process.is_alive():
                    raise GeneratorError(f"the generator process died (exit code {self._process.exitcode}) "
                                         f"before it answered {what}") from None
                raise GeneratorTimeout(f"the generator process did not answer {what} within {self.timeout_s:g} s "
                                       "(async_generation.timeout_s): it is hung or far too slow; stopping") from None
            if kind == "error":
                raise GeneratorError(f"the generator process failed:\n{payload}")
            self._done[got] = payload
            if ticket == -1 and got == -1:
                self._done.pop(-1)
                return


def _serve(spec: dict[str, Any], requests, replies) -> None:
    """The worker's loop (module docstring): weights and generations, in order, until ``stop``."""
    try:
        torch.set_num_threads(spec["threads"])
        from rlvr.engines.hf import HFEngine
        from rlvr.modeling.loading import load_policy, load_tokenizer

        model = load_policy(spec["path"], dtype=spec["dtype"], device="cpu").eval()
        tokenizer = load_tokenizer(spec["path"])
        eos_token_ids(model, tokenizer)  # a model without EOS fails here, in the worker's own words
        engine = HFEngine(model, tokenizer, max_batch_size=spec["max_batch_size"], weight_sync="merged")
        episodes = _EpisodePlayer(spec["episodes"], tokenizer) if spec["episodes"] else None
    except BaseException:
        replies.put(("error", -1, traceback.format_exc()))
        return
    replies.put(("ready", -1, None))
    publication, parent, free_since = 0, os.getppid(), time.perf_counter()
    while True:
        try:
            kind, ticket, payload = requests.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the trainer died without closing us (SIGKILL): nobody is listening
                return
            continue
        idle = time.perf_counter() - free_since
        try:
            if kind == "stop":
                return
            if kind == "weights":
                engine.update_weights(payload["weights"].items())
                publication = payload["publication"]
            else:
                if payload["rng"] is not None:
                    torch.set_rng_state(payload["rng"])
                elif payload["seed"] is not None:
                    torch.manual_seed(payload["seed"])
                start = time.perf_counter()
                if payload["problems"] is not None:
                    groups = episodes.play(engine, payload)
                else:
                    groups = engine.generate(payload["prompts"], payload["n"], payload["sampling"])
                replies.put(("groups", ticket, (groups, {"publication": publication, "idle_s": idle,
                                                         "seconds": time.perf_counter() - start,
                                                         "rng": torch.get_rng_state()})))
        except BaseException:
            replies.put(("error", ticket, traceback.format_exc()))
            return
        free_since = time.perf_counter()


class _EpisodePlayer:
    """The worker's :class:`~rlvr.rollout.episodes.EpisodeRunner`, built from the trainer's settings;
    environment messages are encoded for the chat template each request names per problem."""

    def __init__(self, settings: dict[str, Any], tokenizer):
        from rlvr.rollout.env_tokens import MessageEncoders
        from rlvr.rollout.episodes import EpisodeRunner

        encoders = MessageEncoders(tokenizer, settings["messages"], settings["eos_ids"])
        self._templates: dict[int, Any] = {}

        def messages_of(problem):
            return encoders(self._templates[id(problem)])

        self.runner = EpisodeRunner(messages_of, settings["environments"], default=settings["default"],
                                    max_turns=settings["max_turns"], max_episode_tokens=settings["max_episode_tokens"],
                                    workers=settings["workers"])

    def play(self, engine, payload: dict[str, Any]) -> list[list[Completion]]:
        self._templates = {id(p): t for p, t in zip(payload["problems"], payload["templates"])}
        return self.runner.generate(engine, payload["problems"], payload["prompts"], payload["n"], payload["sampling"])

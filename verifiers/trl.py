"""Bring TRL-style reward functions: ``f(prompts, completions, **columns) -> list[float | None]``.

TRL calls a reward function with a batch: ``prompts`` and ``completions`` (strings, or lists of
chat messages for conversational datasets) plus every other dataset column as a keyword argument
holding a list; the function returns one float per completion, or ``None`` where it has no
opinion. Here each item is one call with batches of one (so that the runner's per-item deadline
applies), and ``None`` becomes ``status="abstain"``.

From Python::

    from rlvr.verifiers.trl import from_trl, register_trl_reward

    def my_reward_fn(prompts, completions, answer, **kwargs):
        return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]

    verifier = from_trl(my_reward_fn)                      # a Verifier object
    register_trl_reward("my_reward", my_reward_fn)         # usable by name, from config too
    assert verifier.score("it is 42", {"answer": "42"}).score == 1.0

From config (the function is imported from ``module:attribute``)::

    verifier: {name: trl, options: {function: my_package.rewards:accuracy_reward}}

``prompts`` is the sample's prompt (the chat messages the model answered): with
``conversational`` the messages themselves, else their text (the contents joined by blank lines,
which for an ordinary single-message prompt is just the question). A reference field named
``prompt_key`` overrides it (for data that keeps its own prompt column). Every other reference key
is passed as a one-element list under its own name, and ``finish_reason`` too (TRL has no such
column; declare it to use it). Only the keyword arguments the function declares are passed (all
of them when it takes ``**kwargs``).
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Callable

from rlvr.verifiers.base import Reward, Verifier, coerce_reward
from rlvr.verifiers.plugins import import_target
from rlvr.verifiers.registry import register_verifier


def resolve_function(target: str | Callable) -> Callable:
    """A callable from ``"package.module:attribute"`` (or ``package.module.attribute``), or itself."""
    if callable(target):
        return target
    module_name, sep, attr = str(target).partition(":")
    if not sep:
        module_name, _, attr = str(target).rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"trl: function must look like 'package.module:function', got {target!r}")
    obj = import_target(f"{module_name}:{attr}")
    if not callable(obj):
        raise TypeError(f"trl: {target!r} is not callable")
    return obj


@register_verifier("trl")
class TRLRewardVerifier(Verifier):
    """Any TRL reward function as a verifier (see the module docstring).

    Options:
        function: ``"package.module:function"`` or the callable itself.
        conversational: pass completions as ``[{"role": "assistant", "content": text}]`` and a
            string prompt as ``[{"role": "user", "content": prompt}]``.
        prompt_key: the reference field holding the prompt.
        kwargs: extra keyword arguments for every call.
    """

    name = "trl"
    description = "a TRL reward function f(prompts, completions, **columns) -> [float|None]; None = abstain"

    def __init__(self, function: str | Callable, conversational: bool = False, prompt_key: str = "prompt",
                 kwargs: dict | None = None):
        self.function = function
        self.conversational = conversational
        self.prompt_key = prompt_key
        self.kwargs = dict(kwargs or {})
        self._func = resolve_function(function)
        self._accepts = _accepted_keywords(self._func)
        label = getattr(self._func, "__name__", None)
        if label:
            self.description = f"TRL reward function {getattr(self._func, '__module__', '?')}.{label}"

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if isinstance(self.function, str):  # re-import by name on the other side
            state.pop("_func", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "_func" not in state:
            self._func = resolve_function(self.function)

    def score(self, completion: str, reference: dict, *, prompt: list | None = None,
              finish_reason: str | None = None) -> Reward:
        start = time.perf_counter()
        if self.prompt_key in reference:
            prompt = reference[self.prompt_key]
        elif prompt is not None and not self.conversational:
            prompt = "\n\n".join(str(m.get("content", "")) for m in prompt)
        elif prompt is None:
            prompt = ""
        if self.conversational:
            completions: list = [[{"role": "assistant", "content": completion}]]
            prompts: list = [prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]]
        else:
            completions, prompts = [completion], [prompt]
        columns = {k: [v] for k, v in reference.items() if k != self.prompt_key}
        if finish_reason is not None:
            columns.setdefault("finish_reason", [finish_reason])
        kwargs = {**columns, **self.kwargs}
        if self._accepts is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self._accepts}
        values = self._func(prompts=prompts, completions=completions, **kwargs)
        if not isinstance(values, (list, tuple)) or len(values) != 1:
            return Reward(0.0, status="error", latency_s=time.perf_counter() - start,
                          info={"error": f"reward function returned {type(values).__name__} of length "
                                         f"{len(values) if hasattr(values, '__len__') else '?'}, expected a list of 1"})
        reward = coerce_reward(values[0])
        reward.latency_s = time.perf_counter() - start
        return reward


def _accepted_keywords(func: Callable) -> set[str] | None:
    """Keyword names ``func`` takes, or None when it takes ``**kwargs`` (anything goes)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def from_trl(func: Callable, *, conversational: bool = False, prompt_key: str = "prompt",
             name: str | None = None, **kwargs: Any) -> TRLRewardVerifier:
    """Wrap a TRL reward function as a :class:`Verifier` object."""
    verifier = TRLRewardVerifier(func, conversational=conversational, prompt_key=prompt_key, kwargs=kwargs or None)
    if name:
        verifier.name = name
    return verifier


def trl_factory(func: Callable, **defaults: Any) -> Callable:
    """A verifier factory for the TRL reward function ``func``: its options are those of the ``trl``
    verifier (``conversational``, ``prompt_key``, ``kwargs``), ``defaults`` pre-set."""

    def factory(conversational: bool = False, prompt_key: str = "prompt", kwargs: dict | None = None) -> TRLRewardVerifier:
        settings = {"conversational": conversational, "prompt_key": prompt_key, "kwargs": kwargs, **defaults}
        return TRLRewardVerifier(func, **settings)

    doc = (inspect.getdoc(func) or "").split("\n")[0]
    factory.__doc__ = f"TRL reward function {getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}" + \
        (f": {doc}" if doc else "")
    factory.__module__ = getattr(func, "__module__", None)  # type: ignore[assignment]
    factory.__qualname__ = f"trl:{getattr(func, '__qualname__', repr(func))}"
    factory._rlvr_trl_factory = True  # type: ignore[attr-defined]
    return factory


def register_trl_reward(name: str, func: Callable, *, overwrite: bool = False, **defaults: Any) -> Callable:
    """Register ``func`` under ``name``, so ``get_verifier(name)`` (and a config) can use it. From an
    installed package, an ``rlvr.verifiers`` entry point naming the function does the same."""
    factory = trl_factory(func, **defaults)
    register_verifier(name, overwrite=overwrite)(factory)
    return factory

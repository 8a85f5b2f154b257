"""Multi-turn episodes, token-in, token-out: the engine continues from the episode's own ids.

    runner = EpisodeRunner(messages_of, environments, max_turns=4, max_episode_tokens=512)
    groups = runner.generate(engine, problems, prompt_ids, n, sampling)   # like engine.generate: G per problem

Each turn, every running episode is continued by the engine from its ids so far (prompt, sampled
turns, environment messages); the environment (:mod:`rlvr.tasks.environments`) answers the turn's
text; its messages are tokenised alone (:mod:`rlvr.rollout.env_tokens`) and appended. Nothing sampled
is ever decoded and encoded again, so the trained tokens are the sampled ones.

An episode comes back as one :class:`~rlvr.engines.base.Completion`: ``token_ids`` every token after
the prompt, ``loss_mask`` 1 on sampled tokens and 0 on environment tokens (log-prob 0 there),
``text`` its last assistant message (what the verifier scores), ``finish_reason`` ``length`` when the
token budget cut it (a turn cut, or an environment reply that no longer fits) and ``stop`` otherwise
(``max_turns`` included: the model finished its last turn, so the verifier reads it as a final
answer), and ``episode`` its :class:`EpisodeRecord`.

Stop strings (``generation.stop``) end a turn as an end-of-turn token does: the turn is finished
(``finish_reason`` ``stop``), its text (the stop string kept or cut, ``generation.include_stop``) goes
to the environment, which answers. In the ``template`` message format the chat template's end-of-turn
token, which the model did not sample, is appended before the environment's messages as an environment
token (loss mask 0), so the context stays in the template's form. It ends with one stop reason:

    eos         the model ended its turn and the environment had nothing to add (the final answer)
    env_done    the environment ended it
    max_turns   ``max_turns`` assistant turns were taken
    max_tokens  a turn was cut by the budget (the episode's ``max_episode_tokens`` tokens after the
                prompt, or ``generation.max_new_tokens`` per turn), or an environment message would
                not fit with room for one more token (it is not appended: no row is ever over budget)
    error       the environment failed: ``EnvironmentFailure`` or any other exception from its code
                (``episode()``, ``step()``, ``close()``), a call past its deadline, or a reply that is
                not an :class:`EnvStep` of messages; its
                sample is masked from the loss and counted, and every other episode goes on

Fault isolation. Every call into environment code (``episode(problem)`` when the episode starts,
``step(text)`` after each turn, ``close()`` when it ends) runs in a daemon thread of its own
(:func:`rlvr.verifiers.threads.run_with_deadlines`, at most ``workers`` at once) and is waited for at most
the step deadline: the larger of ``step_timeout_s`` (``environment.step_timeout_s``) and the
environment's own ``step_timeout_s`` attribute, when it declares one (the ``tools`` environment
declares ``max_calls_per_turn x (timeout_s + 5 s)``). A call past it ends its episode as ``error``;
Python cannot kill a thread, so the call runs on, abandoned, until it returns or the process ends.
Every episode's ``close()`` is called once, whether it ended, failed, or generation was interrupted.

Observation size. An environment reply's text is measured in characters before it is tokenised:
a token holds at most :data:`CHARS_PER_TOKEN_BOUND` characters by assumption (generous: English
averages about 4), so a reply over that many characters per token left in the budget cannot fit and
ends the episode as cut by the budget (``max_tokens``, ``finish_reason`` ``length``) without
tokenising a megabyte. It is not an ``error``: the reply is most often the model's own doing (a tool
quickstart's policy printing ``718**1444``), so it is a truncated sample like any other, which
``algorithm.overlong`` masks (``filter``) or shapes, and which never counts toward
``verifier.max_error_frac``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from rlvr.engines.base import Completion, Engine, SamplingParams
from rlvr.rollout.env_tokens import MessageEncoders
from rlvr.tasks.base import Problem
from rlvr.tasks.environments import EnvironmentFailure, EnvStep, get_environment
from rlvr.verifiers.threads import Outcome, run_with_deadlines
from rlvr.verifiers.base import Reward

STOP_REASONS = ("eos", "env_done", "max_turns", "max_tokens", "error")

#: Seconds a call into environment code may take when neither the run nor the environment says.
DEFAULT_STEP_TIMEOUT_S = 60.0
#: The most characters one token is assumed to hold, to bound an environment reply before tokenising it.
CHARS_PER_TOKEN_BOUND = 16
#: Characters of an environment error's message kept on the episode record.
MAX_ERROR_CHARS = 500


@dataclass
class EpisodeRecord:
    """What happened in one episode (``Completion.episode``)."""

    stop: str = ""
    turns: int = 0  # assistant turns
    tool_calls: int = 0
    tool_errors: int = 0
    tool_latency_s: list[float] = field(default_factory=list)
    turn_reward: float = 0.0  # the environment's rewards, summed (added to the verifier's score)
    error: str | None = None  # why an ``error`` episode failed, at most MAX_ERROR_CHARS characters
    messages: list[dict[str, str]] = field(default_factory=list)  # the conversation after the prompt


class _Running:
    """One episode in progress: its ids and masks so far, its environment and environment episode, its
    record, and whether the token budget cut it (``cut``: its completion's ``finish_reason`` is ``length``)."""

    def __init__(self, prompt: list[int], problem: Problem, environment: Any, messages: Any, deadline_s: float):
        self.prompt, self.problem, self.environment, self.messages = prompt, problem, environment, messages
        self.deadline_s = deadline_s  # seconds each call into the environment's code may take
        self.env_episode: Any = None
        self.ids: list[int] = []  # after the prompt
        self.logprobs: list[float] = []
        self.mask: list[int] = []
        self.last_text = ""
        self.unclosed_turn = False  # the last turn ended on a stop string, not on the end-of-turn token
        self.cut = False
        self.closed = environment is None  # nothing to close without an environment
        self.record = EpisodeRecord()

    def context(self) -> list[int]:
        return self.prompt + self.ids

    def append(self, ids: Sequence[int], logprobs: Sequence[float], sampled: bool) -> None:
        self.ids += ids
        self.logprobs += logprobs
        self.mask += [int(sampled)] * len(ids)

    def end(self, stop: str, error: str | None = None, *, cut: bool = False) -> None:
        """End the episode (the first end holds; it is closed with the others of its turn)."""
        if self.record.stop:
            return
        self.record.stop, self.cut = stop, self.cut or cut
        self.record.error = None if error is None else _short(error)

    def completion(self) -> Completion:
        return Completion(token_ids=self.ids, text=self.last_text, logprobs=self.logprobs,
                          finish_reason="length" if self.cut else "stop", loss_mask=self.mask, episode=self.record)


class EpisodeRunner:
    """Runs episodes (see the module docstring) with any :class:`~rlvr.engines.base.Engine`, which is
    called with each episode's ids so far.

    Args:
        messages: problem -> the encoder of its environment's messages
            (:func:`rlvr.rollout.env_tokens.message_encoder` for the chat template its prompt is rendered with).
        environments: ``{name: environment}`` for every environment a problem may name.
        default: the environment of problems that name none (``environment.name``); None: such a
            problem's episode is one turn, as without an environment.
        max_turns: assistant turns per episode at most.
        max_episode_tokens: tokens after the prompt per episode at most (sampled and environment).
        workers: threads that run environment steps at once (tools in the sandbox).
        step_timeout_s: seconds each call into an environment's code (``episode``, ``step``,
            ``close``) may take before its episode ends as ``error``; an environment that declares a
            larger ``step_timeout_s`` of its own gets that.
    """

    def __init__(self, messages, environments: dict[str, Any], *, default: str | None = None,
                 max_turns: int = 4, max_episode_tokens: int = 1024, workers: int = 4,
                 step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S):
        self.messages, self.environments, self.default = messages, environments, default
        self.max_turns, self.max_episode_tokens, self.workers = max_turns, max_episode_tokens, workers
        self.step_timeout_s = step_timeout_s

    def environment_of(self, problem: Problem):
        name = self.default or problem.environment
        return self.environments[name] if name else None

    def deadline_of(self, environment: Any) -> float:
        """Seconds each call into ``environment``'s code may take (module docstring)."""
        own = getattr(environment, "step_timeout_s", None)
        if isinstance(own, (int, float)) and not isinstance(own, bool) and math.isfinite(own) and own > 0:
            return max(self.step_timeout_s, float(own))
        return self.step_timeout_s

    def generate(self, engine: Engine, problems: Sequence[Problem], prompts: Sequence[Sequence[int]], n: int,
                 sampling: SamplingParams) -> list[list[Completion]]:
        """``n`` episodes per problem played with ``engine``, grouped by problem like :meth:`Engine.generate`."""
        running = []
        for problem, prompt in zip(problems, prompts):
            env = self.environment_of(problem)
            encoder = self.messages(problem) if env is not None else None
            deadline = self.deadline_of(env) if env is not None else 0.0
            running += [_Running(list(prompt), problem, env, encoder, deadline) for _ in range(n)]
        try:
            self._open([e for e in running if e.environment is not None])
            first = engine.generate([list(p) for p in prompts], n, self._capped(sampling, self.max_episode_tokens))
            self._take_turn(running, [c for group in first for c in group])
            active = [e for e in running if not e.record.stop]
            self._answer(active)
            while active := [e for e in active if not e.record.stop]:
                for cap, part in _by_cap(active, sampling.max_new_tokens, self.max_episode_tokens).items():
                    turns = engine.generate([e.context() for e in part], 1, self._capped(sampling, cap))
                    self._take_turn(part, [group[0] for group in turns])
                active = [e for e in active if not e.record.stop]
                self._answer(active)
        finally:  # every episode is closed, however generation ended (an engine error, Ctrl-C)
            self._close(running)
        return [[e.completion() for e in running[k * n:(k + 1) * n]] for k in range(len(problems))]

    @staticmethod
    def _capped(sampling: SamplingParams, cap: int) -> SamplingParams:
        return replace(sampling, max_new_tokens=min(sampling.max_new_tokens, cap))

    def _call(self, episodes: list[_Running], call: Callable[[_Running], Callable[[], Any]]) -> list[Outcome]:
        """``call(episode)()`` for each episode, in daemon threads (``workers`` at once), each waited
        for at most its episode's deadline (:func:`rlvr.verifiers.threads.run_with_deadlines`)."""
        return run_with_deadlines([call(e) for e in episodes], [e.deadline_s for e in episodes],
                                  workers=self.workers, name="rlvr-env")

    def _open(self, episodes: list[_Running]) -> None:
        """Start each episode's environment episode (``environment.episode(problem)``); one that raises,
        hangs or returns something without ``step`` ends its episode as ``error`` (the first turn is
        still sampled with the others, then masked)."""
        for episode, outcome in zip(episodes, self._call(episodes, lambda e: lambda: e.environment.episode(e.problem))):
            failure = _failure(outcome, "episode()", episode.deadline_s)
            if failure is None and not callable(getattr(outcome.value, "step", None)):
                failure = f"episode() returned {_kind(outcome.value)}, which has no step(text) method"
            if failure is None:
                episode.env_episode = outcome.value
            else:
                episode.closed = True  # no episode object to close
                episode.end("error", failure)

    def _take_turn(self, episodes: list[_Running], turns: list[Completion]) -> None:
        """Append each episode's sampled turn; end the ones that cannot go on."""
        for episode, turn in zip(episodes, turns):
            episode.append(turn.token_ids, turn.logprobs, sampled=True)
            episode.last_text = turn.text
            episode.unclosed_turn = turn.stop_string is not None
            episode.record.turns += 1
            episode.record.messages.append({"role": "assistant", "content": turn.text})
            episode.cut = turn.finish_reason == "length"  # also for an episode that failed at its start
            if episode.cut:
                episode.end("max_tokens")
            elif episode.environment is None:
                episode.end("eos")

    def _answer(self, episodes: list[_Running]) -> None:
        """The environment's answer to each episode's last turn (steps run in threads, under the
        deadline), appended; then the episodes that ended are closed."""
        outcomes = self._call(episodes, lambda e: lambda: e.env_episode.step(e.last_text))
        for episode, outcome in zip(episodes, outcomes):
            failure = _failure(outcome, "step()", episode.deadline_s) or _invalid_step(outcome.value)
            if failure is not None:
                episode.end("error", failure)
                continue
            step: EnvStep = outcome.value
            record = episode.record
            record.tool_calls += step.tool_calls
            record.tool_errors += step.tool_errors
            record.tool_latency_s += list(step.tool_latency_s)
            record.turn_reward += step.reward
            if step.done:
                episode.end("env_done")
            elif not step.messages:
                episode.end("eos")
            elif record.turns >= self.max_turns:
                episode.end("max_turns")
            else:
                self._append_reply(episode, step.messages)
        self._close([e for e in episodes if e.record.stop])

    def _append_reply(self, episode: _Running, messages: list[dict[str, str]]) -> None:
        """Tokenise the environment's ``messages`` and append them, or end the episode as cut by the budget
        when they do not fit (checked on their length in characters first: module docstring)."""
        left = self.max_episode_tokens - len(episode.ids) - 1  # tokens they may take, leaving one to sample
        if sum(len(m["content"]) for m in messages) > max(left, 0) * CHARS_PER_TOKEN_BOUND:
            episode.end("max_tokens", cut=True)  # a megabyte is never tokenised
            return
        try:
            ids = _turn_closing(episode) + episode.messages.encode(messages)
        except Exception as exc:  # a message the chat template cannot render is the environment's reply's fault
            episode.end("error", f"the environment's reply could not be encoded: {type(exc).__name__}: {exc}")
            return
        if len(ids) > left:
            episode.end("max_tokens", cut=True)
        else:
            episode.append(ids, [0.0] * len(ids), sampled=False)
            episode.record.messages += messages

    def _close(self, episodes: list[_Running]) -> None:
        """``close()`` each episode not closed yet that has one, under the deadline; one that raises
        or hangs turns its episode into an ``error`` (an episode still running is ended as one)."""
        todo = [e for e in episodes if not e.closed]
        for episode in todo:
            episode.closed = True
            if not episode.record.stop:
                episode.end("error", "the episode was interrupted before it ended")
        todo = [e for e in todo if callable(getattr(e.env_episode, "close", None))]
        for episode, outcome in zip(todo, self._call(todo, lambda e: e.env_episode.close)):
            failure = _failure(outcome, "close()", episode.deadline_s)
            if failure is not None and episode.record.stop != "error":
                episode.record.stop, episode.record.error = "error", _short(failure)


def _turn_closing(episode: _Running) -> list[int]:
    """The end-of-turn token to write after a turn that a stop string ended, in the ``template`` message
    format (whose rendering of the environment's messages starts right after that token); else none."""
    eos_text = getattr(episode.messages, "eos_text", None)
    if not episode.unclosed_turn or not eos_text:
        return []
    return [episode.messages.tokenizer.convert_tokens_to_ids(eos_text)]


def _failure(outcome: Outcome, call: str, deadline_s: float) -> str | None:
    """Why a call into environment code failed (raised, or passed its deadline), or None."""
    if outcome.timed_out:
        return f"{call} did not return within {deadline_s:g} s (environment.step_timeout_s)"
    if isinstance(outcome.error, EnvironmentFailure):
        return _short(outcome.error)
    if outcome.error is not None:
        return f"{call} raised {type(outcome.error).__name__}: {_short(outcome.error)}"
    return None


def _invalid_step(value: Any) -> str | None:
    """Why what ``step()`` returned is not an answer the runner can use, or None."""
    if not isinstance(value, EnvStep):
        return f"step() returned {_kind(value)}, not an EnvStep"
    if not isinstance(value.messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value.messages):
        return "step() returned EnvStep.messages that are not a list of {'role': str, 'content': str} dicts"
    if isinstance(value.reward, bool) or not isinstance(value.reward, (int, float)) or not math.isfinite(value.reward):
        return f"step() returned EnvStep.reward {_kind(value.reward)}, not a finite number"
    counts = (value.tool_calls, value.tool_errors)
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        return "step() returned EnvStep.tool_calls / tool_errors that are not integers >= 0"
    if not isinstance(value.tool_latency_s, (list, tuple)) or not all(
            isinstance(s, (int, float)) and not isinstance(s, bool) for s in value.tool_latency_s):
        return "step() returned EnvStep.tool_latency_s that is not a list of seconds"
    return None


def _kind(value: Any) -> str:
    """A short description of a value: its type and the start of its repr."""
    try:
        text = repr(value)
    except Exception:
        text = "?"
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _short(text: str) -> str:
    """``text`` cut to :data:`MAX_ERROR_CHARS` characters (an error message on the episode record)."""
    try:
        text = str(text)
    except Exception:
        text = "(the error's message could not be read)"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _by_cap(episodes: list[_Running], per_turn: int, budget: int) -> dict[int, list[_Running]]:
    """Running episodes grouped by how many tokens their next turn may sample (the per-turn cap, or
    less what is left of the budget), so that no episode is generated past its budget."""
    out: dict[int, list[_Running]] = {}
    for episode in episodes:
        out.setdefault(min(per_turn, budget - len(episode.ids)), []).append(episode)
    return out


def build_environments(section, problems: Iterable[Problem]) -> dict[str, Any]:
    """Every environment a run's ``problems`` play in, built once from the ``environment:`` config
    ``section`` (its ``options`` go to each): ``section.name`` for all, else each problem's own. An
    unknown name or option fails here, before any model is loaded."""
    names = {section.name} if section.name else {p.environment for p in problems if p.environment}
    return {name: get_environment(name, **section.options) for name in sorted(names)}


def episode_runner(section, tokenizer, encode, eos_ids: Sequence[int],
                   environments: dict[str, Any], problems: Iterable[Problem]) -> EpisodeRunner | None:
    """The run's :class:`EpisodeRunner` (None when no problem has an environment). Each chat template
    the prompts are rendered with is checked once for ``section.messages``
    (:func:`rlvr.rollout.env_tokens.message_encoder`); in ``template`` mode, the tools of a problem's
    environment are listed in its prompt (``encode``, a :class:`rlvr.rollout.suites.PromptEncoder`)."""
    if not environments:
        return None
    encoders = MessageEncoders(tokenizer, section.messages, eos_ids)

    def messages_of(problem: Problem):
        return encoders(encode.template_of(problem))

    runner = EpisodeRunner(messages_of, environments, default=section.name, max_turns=section.max_turns,
                           max_episode_tokens=section.max_episode_tokens, workers=section.workers,
                           step_timeout_s=section.step_timeout_s)
    for problem in problems:
        env = runner.environment_of(problem)
        schemas = env.tool_schemas() if env is not None and hasattr(env, "tool_schemas") else None
        if schemas and messages_of(problem).mode == "template":
            encode.offer_tools([problem], schemas)
    return runner


def gold_episode_ids(turns: Sequence[dict[str, str]], tokenizer, messages, eos_id: int) -> tuple[list[int], list[int]]:
    """``(ids, loss mask)`` of a gold multi-turn solution (the messages after the prompt: assistant turns
    and environment messages), laid out as an episode of :class:`EpisodeRunner` is: each assistant turn
    its content's ids and ``eos_id`` (mask 1), each run of environment messages encoded by ``messages``
    (mask 0). SFT on such solutions teaches exactly the token layout that RL then samples."""
    ids: list[int] = []
    mask: list[int] = []
    pending: list[dict[str, str]] = []
    for message in [*turns, {"role": "assistant", "content": None}]:  # a sentinel flushes the last environment run
        if message.get("role") != "assistant":
            pending.append(message)
            continue
        if pending:
            env = messages.encode(pending)
            ids, mask, pending = ids + env, mask + [0] * len(env), []
        if message["content"] is not None:
            turn = tokenizer(message["content"], add_special_tokens=False)["input_ids"] + [eos_id]
            ids, mask = ids + turn, mask + [1] * len(turn)
    return ids, mask


def settle_rewards(completions: Sequence[Completion], rewards: Sequence[Reward]) -> list[Reward]:
    """The verifier's rewards of ``completions`` with what their episodes add: an episode that ended
    in ``error`` is an ``error`` reward (masked and counted like a verifier failure, never a 0), and
    the environment's turn rewards are added to an ``ok`` score (``components["env"]``). Single-turn
    completions pass as they are.

    Turn rewards shape the reward that is trained on; they never decide pass/fail. The verifier's own
    score is kept in ``info["verifier_score"]`` (:func:`verifier_score`), and accuracy, pass@k and
    ``reward/accuracy`` judge that: a right final answer with a -0.1 turn penalty is still right. A turn
    reward that is not a finite number is the environment's fault: that sample is an ``error``."""
    out = []
    for completion, reward in zip(completions, rewards):
        record = completion.episode
        if record is not None and record.stop == "error":
            reward = Reward(0.0, status="error", info={**reward.info, "error": f"environment: {record.error}"})
        elif record is not None and record.turn_reward and reward.status == "ok":
            try:
                shaped = float(reward.score + record.turn_reward)
            except (TypeError, ValueError):  # an environment's reward that is no number
                shaped = math.nan
            if not math.isfinite(shaped):
                reward = Reward(0.0, status="error", info={
                    **reward.info, "error": f"environment: its turn rewards sum to {record.turn_reward!r}, "
                    "not a finite number"})
            else:
                reward = replace(reward, score=shaped, components={**reward.components, "env": record.turn_reward},
                                 info={**reward.info, VERIFIER_SCORE: reward.score})
        out.append(reward)
    return out


#: The ``Reward.info`` key where :func:`settle_rewards` keeps the verifier's own score.
VERIFIER_SCORE = "verifier_score"


def verifier_score(reward: Reward) -> float:
    """The verifier's own score of a (settled) reward: its ``score`` without the turn rewards an episode
    added (:func:`settle_rewards`). Pass/fail is judged on this, never on the shaped sum."""
    return reward.info.get(VERIFIER_SCORE, reward.score)


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def episode_metrics(completions: Sequence[Completion]) -> dict[str, float]:
    """The ``env/`` metrics of a step's episodes: turns and tool calls per episode, the tool error rate,
    tool latency (p50/p95, seconds), the fraction of tokens the environment wrote (masked from the
    loss), the environment's reward, and the fraction of episodes that ended for each stop reason."""
    records = [c.episode for c in completions if c.episode is not None]
    if not records:
        return {}
    n = len(records)
    calls = sum(r.tool_calls for r in records)
    latencies = sorted(s for r in records for s in r.tool_latency_s)
    tokens = sum(len(c.token_ids) for c in completions if c.episode is not None)
    masked = sum(len(c.loss_mask) - sum(c.loss_mask) for c in completions if c.episode is not None)
    metrics = {
        "env/turns": sum(r.turns for r in records) / n,
        "env/tool_calls": calls / n,
        "env/tool_error_rate": sum(r.tool_errors for r in records) / calls if calls else 0.0,
        "env/masked_frac": masked / max(tokens, 1),
        "env/turn_reward": sum(r.turn_reward for r in records) / n,
    }
    if latencies:
        metrics["env/tool_latency_p50"] = _quantile(latencies, 0.5)
        metrics["env/tool_latency_p95"] = _quantile(latencies, 0.95)
    metrics.update({f"env/stop_{reason}": sum(r.stop == reason for r in records) / n for reason in STOP_REASONS})
    return metrics


def _quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values, by linear interpolation."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def episode_summary(record: EpisodeRecord | None) -> dict[str, Any] | None:
    """A JSON-ready view of an episode (sample logs, ``rlvr eval --out``, ``rlvr tasks show``)."""
    if record is None:
        return None
    return {"stop": record.stop, "turns": record.turns, "tool_calls": record.tool_calls,
            "tool_errors": record.tool_errors, "turn_reward": record.turn_reward, "error": record.error,
            "messages": record.messages}

"""Multi-turn episodes, token-in, token-out: the engine continues from the episode's own ids.

    runner = EpisodeRunner(messages_of, environments, max_turns=4, max_episode_tokens=512)
    groups = runner.generate(engine, problems, prompt_ids, n, sampling)   # like engine.generate: G per problem

Each turn, every running episode is continued by the engine from its ids so far (prompt, sampled
turns, environment messages); the environment (:mod:`rlvr.tasks.environments`) answers the turn's
text; its messages are tokenised alone (:mod:`rlvr.rollout.env_tokens`) and appended. Nothing sampled
is ever decoded and encoded again, so the trained tokens are the sampled ones.

An episode comes back as one :class:`~rlvr.engines.base.Completion`: ``token_ids`` every token after
the prompt, ``loss_mask`` 1 on sampled tokens and 0 on environment tokens (log-prob 0 there),
``text`` its last assistant message (what the verifier scores), ``finish_reason`` ``length`` when it
was cut (``max_tokens`` or ``max_turns``), and ``episode`` its :class:`EpisodeRecord`. It ends with
one stop reason:

    eos         the model ended its turn and the environment had nothing to add (the final answer)
    env_done    the environment ended it
    max_turns   ``max_turns`` assistant turns were taken
    max_tokens  a turn was cut by the budget (the episode's ``max_episode_tokens`` tokens after the
                prompt, or ``generation.max_new_tokens`` per turn), or an environment message would
                not fit with room for one more token (it is not appended: no row is ever over budget)
    error       the environment itself failed; its sample is masked from the loss and counted
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

from rlvr.engines.base import Completion, Engine, SamplingParams
from rlvr.rollout.env_tokens import MessageEncoders
from rlvr.tasks.base import Problem
from rlvr.tasks.environments import EnvironmentFailure, get_environment
from rlvr.verifiers.base import Reward

STOP_REASONS = ("eos", "env_done", "max_turns", "max_tokens", "error")


@dataclass
class EpisodeRecord:
    """What happened in one episode (``Completion.episode``)."""

    stop: str = ""
    turns: int = 0  # assistant turns
    tool_calls: int = 0
    tool_errors: int = 0
    tool_latency_s: list[float] = field(default_factory=list)
    turn_reward: float = 0.0  # the environment's rewards, summed (added to the verifier's score)
    error: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)  # the conversation after the prompt


class _Running:
    """One episode in progress: its ids and masks so far, its environment episode, its record."""

    def __init__(self, prompt: list[int], env_episode: Any, messages: Any):
        self.prompt, self.env_episode, self.messages = prompt, env_episode, messages
        self.ids: list[int] = []  # after the prompt
        self.logprobs: list[float] = []
        self.mask: list[int] = []
        self.last_text = ""
        self.record = EpisodeRecord()

    def context(self) -> list[int]:
        return self.prompt + self.ids

    def append(self, ids: Sequence[int], logprobs: Sequence[float], sampled: bool) -> None:
        self.ids += ids
        self.logprobs += logprobs
        self.mask += [int(sampled)] * len(ids)

    def end(self, stop: str, error: str | None = None) -> None:
        self.record.stop, self.record.error = stop, error
        close = getattr(self.env_episode, "close", None)
        if callable(close):
            close()

    def completion(self) -> Completion:
        cut = self.record.stop in ("max_tokens", "max_turns")
        return Completion(token_ids=self.ids, text=self.last_text, logprobs=self.logprobs,
                          finish_reason="length" if cut else "stop", loss_mask=self.mask, episode=self.record)


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
    """

    def __init__(self, messages, environments: dict[str, Any], *, default: str | None = None,
                 max_turns: int = 4, max_episode_tokens: int = 1024, workers: int = 4):
        self.messages, self.environments, self.default = messages, environments, default
        self.max_turns, self.max_episode_tokens, self.workers = max_turns, max_episode_tokens, workers

    def environment_of(self, problem: Problem):
        name = self.default or problem.environment
        return self.environments[name] if name else None

    def generate(self, engine: Engine, problems: Sequence[Problem], prompts: Sequence[Sequence[int]], n: int,
                 sampling: SamplingParams) -> list[list[Completion]]:
        """``n`` episodes per problem played with ``engine``, grouped by problem like :meth:`Engine.generate`."""
        running = []
        for problem, prompt in zip(problems, prompts):
            env = self.environment_of(problem)
            encoder = self.messages(problem) if env else None
            running += [_Running(list(prompt), env.episode(problem) if env else None, encoder) for _ in range(n)]
        first = engine.generate([list(p) for p in prompts], n, self._capped(sampling, self.max_episode_tokens))
        self._take_turn(running, [c for group in first for c in group])
        active = [e for e in running if not e.record.stop]
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            self._answer(active, pool)
            while active := [e for e in active if not e.record.stop]:
                for cap, part in _by_cap(active, sampling.max_new_tokens, self.max_episode_tokens).items():
                    turns = engine.generate([e.context() for e in part], 1, self._capped(sampling, cap))
                    self._take_turn(part, [group[0] for group in turns])
                active = [e for e in active if not e.record.stop]
                self._answer(active, pool)
        return [[e.completion() for e in running[k * n:(k + 1) * n]] for k in range(len(problems))]

    @staticmethod
    def _capped(sampling: SamplingParams, cap: int) -> SamplingParams:
        return replace(sampling, max_new_tokens=min(sampling.max_new_tokens, cap))

    def _take_turn(self, episodes: list[_Running], turns: list[Completion]) -> None:
        """Append each episode's sampled turn; end the ones that cannot go on."""
        for episode, turn in zip(episodes, turns):
            episode.append(turn.token_ids, turn.logprobs, sampled=True)
            episode.last_text = turn.text
            episode.record.turns += 1
            episode.record.messages.append({"role": "assistant", "content": turn.text})
            if turn.finish_reason == "length":
                episode.end("max_tokens")
            elif episode.env_episode is None:
                episode.end("eos")

    def _answer(self, episodes: list[_Running], pool: ThreadPoolExecutor) -> None:
        """The environment's answer to each episode's last turn (steps run in ``pool``), appended."""
        for episode, outcome in zip(episodes, pool.map(_step, episodes)):
            if isinstance(outcome, EnvironmentFailure):
                episode.end("error", str(outcome))
                continue
            record = episode.record
            record.tool_calls += outcome.tool_calls
            record.tool_errors += outcome.tool_errors
            record.tool_latency_s += outcome.tool_latency_s
            record.turn_reward += outcome.reward
            if outcome.done:
                episode.end("env_done")
            elif not outcome.messages:
                episode.end("eos")
            elif record.turns >= self.max_turns:
                episode.end("max_turns")
            else:
                ids = episode.messages.encode(outcome.messages)
                if len(episode.ids) + len(ids) + 1 > self.max_episode_tokens:
                    episode.end("max_tokens")
                    continue
                episode.append(ids, [0.0] * len(ids), sampled=False)
                record.messages += outcome.messages


def _step(episode: _Running):
    try:
        return episode.env_episode.step(episode.last_text)
    except EnvironmentFailure as exc:
        return exc


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
                           max_episode_tokens=section.max_episode_tokens, workers=section.workers)
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
    the environment's turn rewards are added to an ``ok`` score. Single-turn completions pass as they are."""
    out = []
    for completion, reward in zip(completions, rewards):
        record = completion.episode
        if record is not None and record.stop == "error":
            reward = Reward(0.0, status="error", info={**reward.info, "error": f"environment: {record.error}"})
        elif record is not None and record.turn_reward and reward.status == "ok":
            reward = replace(reward, score=reward.score + record.turn_reward,
                             components={**reward.components, "env": record.turn_reward})
        out.append(reward)
    return out


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

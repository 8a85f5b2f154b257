"""Multi-turn episodes with a scripted engine: exact tokens across turns, masks, budgets, stop reasons,
and the chat-template check (no model: the character tokenizer of the tiny model)."""

from __future__ import annotations

import pytest

from rlvr.engines.base import Completion, SamplingParams
from rlvr.modeling.tiny import build_char_tokenizer
from rlvr.rollout.batch import collate
from rlvr.rollout.chat import ChatTemplate
from rlvr.rollout.env_tokens import TemplateMessages, TextMessages, check_template, message_encoder
from rlvr.rollout.episodes import EpisodeRunner, episode_metrics, settle_rewards
from rlvr.rollout.groups import Group
from rlvr.tasks.base import Problem
from rlvr.tasks.environments import EnvironmentFailure, EnvStep
from rlvr.verifiers.base import Reward
from rlvr.verifiers.errors import InvalidValueError

TOKENIZER = build_char_tokenizer()
EOS, UNK = TOKENIZER.eos_token_id, TOKENIZER.unk_token_id


def ids(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


class ScriptedEngine:
    """Replies ``reply(context ids, sample index)`` (ids, cut at max_new_tokens), and records every call."""

    pad_id, weight_sync = TOKENIZER.pad_token_id, "shared"

    def __init__(self, reply):
        self.reply, self.calls, self.caps = reply, [], []

    def generate(self, prompts, n, sampling):
        self.calls.append([list(p) for p in prompts])
        self.caps.append(sampling.max_new_tokens)
        groups = []
        for prompt in prompts:
            group = []
            for k in range(n):
                out = list(self.reply(list(prompt), k))[: sampling.max_new_tokens]
                finish = "stop" if out and out[-1] == EOS else "length"
                group.append(Completion(out, TOKENIZER.decode(out, skip_special_tokens=True), [-0.5] * len(out), finish))
            groups.append(group)
        return groups


class Echo:
    """Answers every turn with a ``tool`` message, ``rounds`` times, then nothing (the episode ends)."""

    name = "echo"

    def __init__(self, rounds=1, content="ok", done_after=None, fail_at=None, reward=0.0):
        self.rounds, self.content, self.done_after, self.fail_at, self.reward = rounds, content, done_after, fail_at, reward

    def episode(self, problem):
        env, state = self, {"turn": 0}

        class Episode:
            def step(self, text):
                state["turn"] += 1
                if env.fail_at == state["turn"]:
                    raise EnvironmentFailure("sandbox down")
                if env.done_after == state["turn"]:
                    return EnvStep(messages=[{"role": "tool", "content": "bye"}], done=True, reward=env.reward)
                if state["turn"] > env.rounds:
                    return EnvStep(reward=env.reward)
                return EnvStep(messages=[{"role": "tool", "content": env.content}], tool_calls=1, reward=env.reward,
                               tool_latency_s=[0.01 * state["turn"]])

        return Episode()


def problem(environment="echo"):
    return Problem(id="p", prompt=[{"role": "user", "content": "2*3="}], reference={"answer": "6"}, verifier="numeric",
                   environment=environment)


def runner(env, **kwargs):
    text = TextMessages(TOKENIZER)
    return EpisodeRunner(lambda problem: text, {"echo": env}, **kwargs), text


SAMPLING = SamplingParams(max_new_tokens=16)


def test_each_turn_continues_from_the_exact_sampled_ids():
    # a turn with ids that decoding and encoding again would change: <unk> disappears from the text
    turn = [ids("a")[0], UNK, ids("b")[0], EOS]
    engine = ScriptedEngine(lambda context, k: turn)
    episodes, text = runner(Echo(rounds=2), max_turns=5)
    prompt = ids("2*3=")
    [[episode]] = episodes.generate(engine, [problem()], [prompt], 1, SAMPLING)

    contexts = [call[0] for call in engine.calls]
    assert len(contexts) == 3  # three turns: two tool replies, then the final answer
    for earlier, later in zip(contexts, contexts[1:]):
        assert later[: len(earlier)] == earlier  # every turn's input is an exact prefix of the next
    tool = text.encode([{"role": "tool", "content": "ok"}])
    assert episode.token_ids == turn + tool + turn + tool + turn  # the sampled ids themselves, never re-encoded
    assert episode.loss_mask == [1] * 4 + [0] * len(tool) + [1] * 4 + [0] * len(tool) + [1] * 4
    assert sum(episode.loss_mask) == 3 * len(turn)  # mask ones = engine-sampled tokens
    assert [lp for lp, m in zip(episode.logprobs, episode.loss_mask) if not m] == [0.0] * (2 * len(tool))
    assert episode.episode.stop == "eos" and episode.episode.turns == 3 and episode.finish_reason == "stop"
    assert episode.text == "ab"  # the last assistant message is what the verifier scores

    # a path that re-tokenises the conversation breaks the prefix property that the check above asserts
    retokenised = ids(TOKENIZER.decode(prompt + turn, skip_special_tokens=True))
    assert retokenised[: len(prompt + turn)] != prompt + turn


def test_groups_share_the_first_turn_call_and_keep_problem_order():
    engine = ScriptedEngine(lambda context, k: ids(str(k)) + [EOS])
    episodes, _ = runner(Echo(rounds=0))
    plain = Problem(id="q", prompt=[{"role": "user", "content": "1+1="}], reference={"answer": "2"}, verifier="numeric")
    groups = episodes.generate(engine, [problem(), plain], [ids("2*3="), ids("1+1=")], 3, SAMPLING)
    assert len(engine.calls) == 1 and len(engine.calls[0]) == 2  # one call, n samples per prompt
    assert [[c.text for c in g] for g in groups] == [["0", "1", "2"]] * 2
    assert all(c.episode.stop == "eos" and c.loss_mask == [1, 1] for g in groups for c in g)


def test_a_spamming_tool_stops_at_exactly_max_turns():
    engine = ScriptedEngine(lambda context, k: ids("call") + [EOS])
    episodes, _ = runner(Echo(rounds=100), max_turns=3, max_episode_tokens=500)
    [[episode]] = episodes.generate(engine, [problem()], [ids("x")], 1, SAMPLING)
    assert episode.episode.stop == "max_turns" and episode.episode.turns == 3 and len(engine.calls) == 3
    # the model finished its last turn (EOS): the verifier reads it as an answer; only a budget cut is "length"
    assert episode.finish_reason == "stop"
    assert episode.token_ids[-1] == EOS  # the last thing in the row is the model's turn, not an unanswered call


def test_an_environment_that_never_ends_stays_within_the_token_budget():
    engine = ScriptedEngine(lambda context, k: ids("go") + [EOS])
    budget = 40
    episodes, _ = runner(Echo(rounds=1000, content="x" * 9), max_turns=1000, max_episode_tokens=budget)
    [[episode]] = episodes.generate(engine, [problem()], [ids("x")], 1, SAMPLING)
    assert episode.episode.stop == "max_tokens" and len(episode.token_ids) <= budget
    assert len(episode.token_ids) == len(episode.loss_mask) == len(episode.logprobs)


def test_a_turn_cut_by_the_budget_ends_the_episode_with_max_tokens():
    engine = ScriptedEngine(lambda context, k: ids("y" * 30) + [EOS])
    episodes, _ = runner(Echo(rounds=5), max_episode_tokens=50)
    [[episode]] = episodes.generate(engine, [problem()], [ids("x")], 1, SamplingParams(max_new_tokens=64))
    assert len(episode.token_ids) <= 50 and episode.episode.stop == "max_tokens"
    tool = len(TextMessages(TOKENIZER).encode([{"role": "tool", "content": "ok"}]))
    assert engine.caps == [50, 50 - 31 - tool]  # the second turn may sample only what is left of the budget


def test_stop_reasons_env_done_and_error_and_their_rewards():
    engine = ScriptedEngine(lambda context, k: ids("z") + [EOS])
    done_runner, _ = runner(Echo(rounds=5, done_after=2, reward=0.25))
    [[done]] = done_runner.generate(engine, [problem()], [ids("x")], 1, SAMPLING)
    assert done.episode.stop == "env_done" and done.episode.turns == 2 and done.episode.turn_reward == 0.5
    failing, _ = runner(Echo(rounds=5, fail_at=2))
    [[failed]] = failing.generate(engine, [problem()], [ids("x")], 1, SAMPLING)
    assert failed.episode.stop == "error" and "sandbox down" in failed.episode.error

    rewards = settle_rewards([done, failed], [Reward(1.0), Reward(1.0)])
    assert rewards[0].score == 1.5 and rewards[0].components["env"] == 0.5  # turn rewards add to the verifier's
    assert rewards[1].status == "error" and "sandbox down" in rewards[1].info["error"]  # masked, never a 0


def test_episode_metrics_and_the_collated_mask():
    engine = ScriptedEngine(lambda context, k: ids("ab") + [EOS])
    episodes, text = runner(Echo(rounds=1))
    groups = episodes.generate(engine, [problem()], [ids("2*3=")], 2, SAMPLING)
    metrics = episode_metrics(groups[0])
    tool = len(text.encode([{"role": "tool", "content": "ok"}]))
    assert metrics["env/turns"] == 2 and metrics["env/tool_calls"] == 1 and metrics["env/stop_eos"] == 1.0
    assert metrics["env/masked_frac"] == pytest.approx(tool / (tool + 6))
    assert metrics["env/tool_latency_p50"] == pytest.approx(0.01)
    batch = collate([Group("s", problem(), ids("2*3="), groups[0])], TOKENIZER.pad_token_id)
    assert batch.response_mask[0].tolist() == [1.0] * 3 + [0.0] * tool + [1.0] * 3
    assert batch.attention_mask[:, -batch.completion_len:].sum() == 2 * (6 + tool)  # the model reads every token


# ---------------------------------------------------------------------------------------------
# Chat templates
# ---------------------------------------------------------------------------------------------

CHATML_LIKE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% if m['role'] == 'assistant' %}"
               "{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
# drops the content of every assistant turn but the last, as Qwen3's template drops earlier reasoning
DROPS_HISTORY = ("{% for m in messages %}<|{{ m['role'] }}|>{% if m['role'] == 'assistant' and not loop.last %}..."
                 "{% else %}{{ m['content'] }}{% endif %}{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _template(tmp_path, source):
    path = tmp_path / "template.jinja"
    path.write_text(source)
    return str(path)


def test_a_prefix_preserving_template_appends_the_tool_turn_and_the_next_generation_prompt(tmp_path):
    encoder = message_encoder(TOKENIZER, "auto", _template(tmp_path, CHATML_LIKE), [EOS])
    assert isinstance(encoder, TemplateMessages)
    assert encoder.render([{"role": "tool", "content": "42"}]) == "\n<|tool|>42\n<|assistant|>"


def test_templates_that_cannot_carry_an_episode_are_refused_with_the_fix(tmp_path):
    with pytest.raises(InvalidValueError, match="not prefix-preserving.*environment.messages=text"):
        message_encoder(TOKENIZER, "auto", _template(tmp_path, DROPS_HISTORY), [EOS])
    # the tiny model's own template writes no end-of-turn token after an assistant message
    with pytest.raises(InvalidValueError, match="not closed by the end-of-turn token"):
        message_encoder(TOKENIZER, "template", "auto", [EOS])
    assert check_template(TOKENIZER, ChatTemplate("file", "x", CHATML_LIKE), "<eos>") is None
    assert isinstance(message_encoder(TOKENIZER, "text", "auto", [EOS]), TextMessages)
    with pytest.raises(InvalidValueError, match="auto, template, text"):
        message_encoder(TOKENIZER, "json", "auto", [EOS])


def test_a_gold_episode_is_laid_out_as_the_runner_lays_out_a_sampled_one():
    from rlvr.rollout.episodes import gold_episode_ids
    from rlvr.tasks import get_task

    problem = get_task("tool_arithmetic", split="test", n=1)[0]
    text = TextMessages(TOKENIZER)
    gold_ids, gold_mask = gold_episode_ids(problem.solution, TOKENIZER, text, EOS)
    turns = iter([ids(m["content"]) + [EOS] for m in problem.solution if m["role"] == "assistant"])
    engine = ScriptedEngine(lambda context, k: next(turns))

    class Replay:  # the gold episode's tool output, as the python environment would answer
        def episode(self, problem):
            answers = iter([[m for m in problem.solution if m["role"] == "tool"], []])

            class Episode:
                def step(self, text):
                    return EnvStep(messages=next(answers))

            return Episode()

    episodes = EpisodeRunner(lambda p: text, {"python": Replay()}, max_turns=4)
    [[sampled]] = episodes.generate(engine, [problem], [ids("x")], 1, SamplingParams(max_new_tokens=64))
    assert sampled.token_ids == gold_ids and sampled.loss_mask == gold_mask  # SFT teaches what RL samples
    assert sampled.text == problem.reference["answer"]

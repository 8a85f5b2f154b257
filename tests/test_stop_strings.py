"""Stop strings (``generation.stop``): the pure helpers, the HF engine on the tiny model (ids end at the
token that completed the string, the text at the string's end, kept or cut), the config key, and an
episode whose turn a stop string ended (the environment answers; the template's end-of-turn token is
written for the model). The vLLM engine's test is in tests/test_engine_vllm.py."""

from __future__ import annotations

import pytest
import torch

from rlvr.config import build_config
from rlvr.config.run import GenerationConfig
from rlvr.engines import HFEngine, SamplingParams
from rlvr.engines.base import cut_at_stop, find_stop, stop_prefix_length
from rlvr.modeling.loading import load_policy, load_tokenizer
from rlvr.modeling.tiny import build_char_tokenizer
from rlvr.rollout.env_tokens import TemplateMessages, TextMessages, message_encoder
from rlvr.rollout.episodes import EpisodeRunner
from rlvr.tasks.base import Problem
from rlvr.tasks.environments import EnvStep

TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id


def ids(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


# ---- pure helpers -----------------------------------------------------------------------------------

def test_the_stop_string_that_ends_first_wins_and_is_kept_or_cut():
    assert find_stop("ab</answer>cd", ["</answer>"]) == (11, "</answer>")
    assert find_stop("abc", ["x"]) is None
    assert find_stop("x</a>yz", ["yz", "</a>"]) == (5, "</a>")  # ends first, though both are there
    assert cut_at_stop("6</answer>\n", ["</answer>"], include_stop=True) == ("6</answer>", "</answer>")
    assert cut_at_stop("6</answer>\n", ["</answer>"], include_stop=False) == ("6", "</answer>")
    assert cut_at_stop("no stop", ["</answer>"], include_stop=True) == ("no stop", None)


def test_the_kept_ids_are_the_shortest_prefix_whose_text_holds_the_string():
    sequence = ids("1+2=3</answer>4+4")
    assert stop_prefix_length(TOKENIZER, sequence, ["</answer>"]) == len("1+2=3</answer>")
    assert stop_prefix_length(TOKENIZER, sequence, ["zz"]) == len(sequence)


def test_sampling_params_take_a_list_and_refuse_an_empty_string():
    assert SamplingParams(stop=["</answer>"]).stop == ("</answer>",)
    with pytest.raises(ValueError, match="non-empty"):
        SamplingParams(stop=[""])


def test_the_config_keys_default_to_no_stop_and_keeping_it():
    assert GenerationConfig().stop == [] and GenerationConfig().include_stop is True
    with pytest.raises(Exception, match="non-empty"):
        GenerationConfig(stop=[""])


# ---- the HF engine --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(tiny_model):
    torch.manual_seed(0)
    return HFEngine(load_policy(tiny_model), load_tokenizer(tiny_model))


def test_greedy_decoding_ends_at_the_token_that_completes_the_stop_string(engine):
    prompt = ids("3+4=")
    free = engine.generate([prompt], 1, SamplingParams(max_new_tokens=24, greedy=True))[0][0]
    assert len(free.token_ids) >= 10 and EOS not in free.token_ids[:10], free.text  # a random model rambles
    stop = free.text[5:8]  # a string the greedy continuation writes
    first = free.text.find(stop) + len(stop)  # where it first ends: a character tokenizer, a token per character
    for include_stop, text in ((True, free.text[:first]), (False, free.text[:first - len(stop)])):
        got = engine.generate([prompt], 2, SamplingParams(max_new_tokens=24, greedy=True, stop=[stop, "\u2603"],
                                                          include_stop=include_stop))[0]
        for completion in got:
            assert completion.token_ids == free.token_ids[:first]  # nothing after the completing token
            assert completion.logprobs == pytest.approx(free.logprobs[:first], abs=1e-5)
            assert completion.text == text and completion.finish_reason == "stop"
            assert completion.stop_string == stop


def test_sampled_rows_stop_each_at_their_own_string_and_the_others_run_on(engine):
    torch.manual_seed(1)
    stop = ["1", "7", "+"]
    groups = engine.generate([ids("2+5="), ids("9+9=")], 16, SamplingParams(max_new_tokens=12, stop=stop))
    completions = [c for g in groups for c in g]
    stopped = [c for c in completions if c.stop_string is not None]
    assert stopped and len(stopped) < len(completions)  # some rows stopped, some did not
    for c in completions:
        text = TOKENIZER.decode(c.token_ids, skip_special_tokens=True)
        assert len(c.logprobs) == len(c.token_ids)
        if c.stop_string is not None:  # the string is completed by the last token, not before
            assert c.finish_reason == "stop" and c.text == text and text.endswith(c.stop_string)
            assert find_stop(TOKENIZER.decode(c.token_ids[:-1], skip_special_tokens=True), stop) is None
        else:
            assert find_stop(text, stop) is None
            assert c.finish_reason == ("stop" if c.token_ids[-1] == EOS else "length")


def test_a_run_config_takes_the_stop_strings_from_an_override(tmp_path, tiny_model):
    from rlvr.config import RunConfig

    config = build_config(RunConfig, {"out": str(tmp_path), "model": {"path": str(tiny_model)},
                                      "data": [{"task": "arithmetic"}]},
                          ['generation.stop=["</answer>", "\\n\\n"]', "generation.include_stop=false"])
    assert config.generation.stop == ["</answer>", "\n\n"]  # JSON escapes: a blank line can be a stop string
    assert config.generation.include_stop is False


# ---- episodes -------------------------------------------------------------------------------------

class StopScripted:
    """An engine that writes ``turns[i]`` on its i-th call and ends it on the stop string ``</a>``, as an
    engine does (no end-of-turn token; ``stop_string`` set)."""

    pad_id, weight_sync = TOKENIZER.pad_token_id, "shared"

    def __init__(self, turns):
        self.turns, self.contexts = list(turns), []

    def generate(self, prompts, n, sampling):
        assert sampling.stop == ("</a>",)
        self.contexts.append([list(p) for p in prompts])
        out = ids(self.turns.pop(0))
        text, string = cut_at_stop(TOKENIZER.decode(out), sampling.stop, sampling.include_stop)
        return [[_completion(out, text, string) for _ in range(n)] for _ in prompts]


def _completion(out, text, string):
    from rlvr.engines.base import Completion

    return Completion(out, text, [-0.5] * len(out), "stop", stop_string=string)


class Once:
    """Answers the first turn with a tool message, then nothing (the episode ends)."""

    def episode(self, problem):
        calls = []

        class Episode:
            def step(self, text):
                calls.append(text)
                return EnvStep(messages=[{"role": "tool", "content": "ok"}] if len(calls) == 1 else [])

        return Episode()


PROBLEM = Problem(id="p", prompt=[{"role": "user", "content": "2*3="}], reference={"answer": "6"}, verifier="numeric",
                  environment="once")
CHATML_LIKE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% if m['role'] == 'assistant' %}"
               "{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.mark.parametrize("mode", ["text", "template"])
def test_a_turn_ended_by_a_stop_string_is_finished_and_the_environment_answers(tmp_path, mode):
    template = tmp_path / "template.jinja"
    template.write_text(CHATML_LIKE)
    messages = (TextMessages(TOKENIZER) if mode == "text"
                else message_encoder(TOKENIZER, "template", str(template), [EOS]))
    engine = StopScripted(["<a>x</a>", "<a>6</a>"])
    runner = EpisodeRunner(lambda problem: messages, {"once": Once()}, max_turns=3, max_episode_tokens=200)
    sampling = SamplingParams(max_new_tokens=40, stop=["</a>"], include_stop=False)
    (episode,), = runner.generate(engine, [PROBLEM], [ids("Q")], 1, sampling)
    assert episode.finish_reason == "stop" and episode.episode.stop == "eos" and episode.episode.turns == 2
    assert episode.text == "<a>6" and episode.episode.messages[0]["content"] == "<a>x"  # the string cut, per turn
    closing = [EOS] if isinstance(messages, TemplateMessages) else []  # the end-of-turn token not sampled
    reply = closing + messages.encode([{"role": "tool", "content": "ok"}])
    assert engine.contexts[1][0] == ids("Q") + ids("<a>x</a>") + reply  # the stop string stays in the ids
    assert episode.token_ids == ids("<a>x</a>") + reply + ids("<a>6</a>")
    assert episode.loss_mask == [1] * 8 + [0] * len(reply) + [1] * 8


# ---- the greedy evaluations of the offline recipes ---------------------------------------------------

def test_sft_evaluation_honours_its_stop_strings(tmp_path, taught_model):
    """``eval.stop`` of ``rlvr sft``: the taught model answers 1-digit sums right often; with every digit a
    stop string that is cut off, each answer ends empty at its first digit, and nothing is right."""
    import json

    from rlvr.config import SFTConfig
    from rlvr.recipes import sft

    def accuracy(name: str, **stops) -> float:
        sft.train(build_config(SFTConfig, {
            "out": str(tmp_path / name), "model": {"path": str(taught_model)},
            "data": {"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}, "limit": 64},
            "optim": {"lr": 1e-9}, "train": {"steps": 1, "batch_size": 8, "threads": 1},
            "eval": {"limit": 40, "max_new_tokens": 3, **stops}, "log": {"progress": False},
        }))
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        return summary["eval_accuracy"]

    assert accuracy("plain") > 0.2
    assert accuracy("cut", stop=list("0123456789"), include_stop=False) == 0.0


def test_dpo_evaluation_takes_stop_strings():
    from rlvr.config.offline import DPOEvalConfig, SFTEvalConfig

    for section in (SFTEvalConfig, DPOEvalConfig):
        assert section().stop == [] and section().include_stop is True
        assert section(stop=["</answer>"], include_stop=False).stop == ["</answer>"]
        with pytest.raises(Exception, match="non-empty"):
            section(stop=[""])

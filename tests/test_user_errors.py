"""A mistake a user can fix is one line that names the file, line or field and the fix: no
traceback (``--debug`` shows it), exit status 2, and nothing half-written. Each case here was hit
by a new user from a fresh clone."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlvr.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(err: str, *fragments: str) -> None:
    lines = [line for line in err.strip().splitlines() if not line.startswith("(rlvr --debug")]
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def write_config(path: Path, model: Path | str, out: Path | None = None, **sections) -> Path:
    raw = {
        "model": {"path": str(model)},
        "data": [{"task": "arithmetic", "options": {"style": "bare", "max_digits": 1}}],
        "generation": {"max_new_tokens": 3},
        "train": {"steps": 1, "prompts_per_step": 2, "group_size": 2},
        "eval": {"at_start": False, "at_end": False},
        "log": {"progress": False, "plot_every": 0},
        **sections,
    }
    if out is not None:
        raw["out"] = str(out)
    path.write_text(yaml.safe_dump(raw))
    return path


# ---------------------------------------------------------------------------------------------
# rlvr train
# ---------------------------------------------------------------------------------------------


def test_unknown_verifier_name_and_option_fail_at_config_load(capsys, tmp_path, tiny_model):
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run", verifier={"name": "mathh"})
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert code == 2 and "verifier.name: unknown verifier 'mathh'; valid verifiers: " in err and "math" in err
    assert not (tmp_path / "run").exists()  # nothing was started
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run",
                       verifier={"name": "math", "options": {"tolerence": 1e-4}})
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert code == 2 and "verifier.options: verifier 'math': unknown option(s) tolerence; valid options: tolerance" in err


def test_a_bad_verifier_option_value_fails_before_the_model_loads(capsys, tmp_path, tiny_model, monkeypatch):
    loaded = []
    monkeypatch.setattr("rlvr.recipes.rl_run.load_run_policy", lambda *a, **k: loaded.append(1))
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run",
                       verifier={"name": "length", "options": {"mode": "sideways"}})
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert_one_line(err, "verifier 'length' rejected its options", "mode must be 'overlong' or 'cosine'")
    assert code == 2 and not loaded


def test_missing_model_folder_is_reported_at_once(capsys, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tmp_path / "no_such_model", tmp_path / "run")
    started = time.perf_counter()
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert code == 2 and time.perf_counter() - started < 20  # no hub retries
    assert_one_line(err, f"model.path: no model at {tmp_path / 'no_such_model'}")
    cfg = write_config(tmp_path / "c.yaml", "someorg/some-model", tmp_path / "run2")
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert_one_line(err, "no model at someorg/some-model", "looks like a hub id", "--local-dir")


def test_missing_and_empty_datasets(capsys, tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv("RLVR_DATA_DIR", str(tmp_path / "nowhere"))
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run", data=[{"task": "gsm8k"}])
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert_one_line(err, "gsm8k: no local data", "$RLVR_DATA_DIR", "Set RLVR_DATA_DIR", "openai/gsm8k")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run2",
                       data=[{"task": "custom", "path": str(empty), "options": {"prompt_field": "question", "answer_field": "answer"}}])
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert code == 2 and "holds no problems" in err and str(empty) in err


def test_a_broken_jsonl_line_names_file_and_line(capsys, tmp_path, tiny_model):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n{oops\n")
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run",
                       data=[{"task": "custom", "path": str(data), "options": {"prompt_field": "question", "answer_field": "answer"}}])
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert code == 2
    assert_one_line(err, f"{data}:2", "invalid JSON")


def test_a_lone_surrogate_in_a_prompt_names_file_and_line(capsys, tmp_path, tiny_model):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"question": "fine", "answer": "1"}) + "\n"
                    + '{"question": "bad \\ud800 text", "answer": "2"}\n')
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run",
                       data=[{"task": "custom", "path": str(data), "options": {"prompt_field": "question", "answer_field": "answer"}}])
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert code == 2
    assert_one_line(err, f"{data}:2", "'question'", "not valid Unicode")


def test_a_plugin_that_fails_to_import(capsys, tmp_path, tiny_model, monkeypatch):
    from importlib import metadata

    from rlvr.tasks import registry

    private = registry.TASKS.copy()
    private.rescan()
    monkeypatch.setattr(registry, "TASKS", private)
    monkeypatch.setattr("rlvr.verifiers.plugins.metadata.entry_points",
                        lambda *, group: [metadata.EntryPoint("my_suite", "my_missing_pkg.suites:Suite", group)]
                        if group == "rlvr.tasks" else [])
    monkeypatch.setattr("rlvr.tasks.TASKS", private)
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run", data=[{"task": "my_suite"}])
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert code == 2
    assert_one_line(err, "task 'my_suite' (my_missing_pkg.suites:Suite, entry point) failed to load",
                    "No module named 'my_missing_pkg'")


def test_unwritable_run_folder(capsys, tmp_path, tiny_model):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = write_config(tmp_path / "c.yaml", tiny_model, blocker / "run")
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert_one_line(err, f"cannot write to run folder {blocker / 'run'}", "choose another --out")
    assert code == 2


def test_resume_without_a_checkpoint(capsys, tmp_path, tiny_model):
    code, _, err = run_cli(capsys, "train", "--resume", str(tmp_path / "nothing_here"))
    assert code == 2
    assert_one_line(err, "nothing_here")
    run = tmp_path / "run"
    run.mkdir()
    write_config(run / "config.yaml", tiny_model, run)
    (run / "metrics.jsonl").write_text("")
    code, _, err = run_cli(capsys, "train", "--resume", str(run))
    assert_one_line(err, f"--resume {run}: no complete checkpoint under {run / 'checkpoints'}")


def test_cuda_on_a_machine_without_cuda(capsys, tmp_path, tiny_model):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run", train={"device": "cuda", "steps": 1})
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert_one_line(err, "train.device=cuda, but this machine has no CUDA device", "use cpu or auto")
    assert code == 2 and not (tmp_path / "run").exists()


def test_debug_shows_the_traceback(tmp_path, tiny_model):
    from rlvr.config import ConfigError

    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run", verifier={"name": "mathh"})
    with pytest.raises(ConfigError):
        main(["--debug", "train", str(cfg)])


# ---------------------------------------------------------------------------------------------
# run folders: never shared by accident
# ---------------------------------------------------------------------------------------------


def test_a_folder_holding_a_run_is_refused_unless_resumed_or_overwritten(capsys, tmp_path, tiny_model):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_model, run)
    code, out, _ = run_cli(capsys, "train", str(cfg))
    assert code == 0 and out.splitlines()[0] == f"run folder: {run}"
    first = (run / "metrics.jsonl").read_text()
    (run / "notes.txt").write_text("mine")
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert code == 2
    assert_one_line(err, f"run folder {run} already holds a run", f"--resume {run}", "--overwrite", "--out")
    assert (run / "metrics.jsonl").read_text() == first  # untouched
    code, _, _ = run_cli(capsys, "train", str(cfg), "--overwrite")
    assert code == 0 and (run / "notes.txt").read_text() == "mine"  # only the run's own files were replaced
    assert len((run / "metrics.jsonl").read_text().splitlines()) == len(first.splitlines())


def test_without_out_each_run_gets_a_new_folder(capsys, tmp_path, tiny_model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", tiny_model)
    folders = []
    for _ in range(2):
        code, out, _ = run_cli(capsys, "train", str(cfg))
        assert code == 0
        folders.append(out.splitlines()[0].removeprefix("run folder: "))
    assert folders[0] != folders[1] and all(f.startswith("runs/grpo-") for f in folders)
    assert all((tmp_path / f / "metrics.jsonl").is_file() for f in folders)


def test_resuming_a_finished_run_writes_no_duplicate_steps(capsys, tmp_path, tiny_model):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", tiny_model, run, train={"steps": 2, "prompts_per_step": 2, "group_size": 2},
                       eval={"at_start": True, "at_end": True, "limit": 4, "every": 1})
    assert run_cli(capsys, "train", str(cfg))[0] == 0
    assert run_cli(capsys, "train", "--resume", str(run))[0] == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]


# ---------------------------------------------------------------------------------------------
# rlvr sft, rlvr eval, rlvr verify
# ---------------------------------------------------------------------------------------------


def test_sft_on_a_suite_without_solutions(capsys, tmp_path, tiny_model):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n")
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"path": str(tiny_model)}, "out": str(tmp_path / "run"),
                                   "data": {"task": "custom", "path": str(data), "options": {"prompt_field": "question", "answer_field": "answer"}}}))
    code, _, err = run_cli(capsys, "sft", str(cfg))
    assert code == 2
    assert_one_line(err, "task 'custom' has no gold solution for 1 of 1 problems", "JSONL file")


def test_eval_with_an_unknown_task_or_a_suite_argument_as_option(capsys, tiny_model):
    code, _, err = run_cli(capsys, "eval", "--model", str(tiny_model), "--task", "gsm9k")
    assert_one_line(err, "unknown task 'gsm9k'; valid tasks: ", "gsm8k")
    code, _, err = run_cli(capsys, "eval", "--model", str(tiny_model), "--task", "arithmetic", "--task-option", "path=x")
    assert_one_line(err, "--task-option path=...: path is not a suite option; use --path")
    assert code == 2


def test_eval_with_an_unknown_engine_names_the_valid_ones(capsys, tiny_model):
    code, _, err = run_cli(capsys, "eval", "--model", str(tiny_model), "--task", "arithmetic", "--engine", "sglang")
    assert_one_line(err, "unknown engine 'sglang'; valid engines: ", "hf", "vllm")
    assert code == 2


def test_eval_greedy_with_several_samples_warns(capsys, tiny_model):
    code, _, err = run_cli(capsys, "eval", "--model", str(tiny_model), "--task", "arithmetic", "--task-option",
                           "style=bare", "--limit", "2", "--samples", "2", "--greedy", "--max-new-tokens", "2",
                           "--workers", "0")
    assert code == 0 and "--greedy makes all 2 samples of a problem identical" in err


def test_verify_input_missing_or_broken(capsys, tmp_path):
    code, _, err = run_cli(capsys, "verify", "--verifier", "math", "--input", str(tmp_path / "none.jsonl"))
    assert_one_line(err, f"--input {tmp_path / 'none.jsonl'}: no such file")
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"completion": "\\boxed{1}", "answer": "1"}) + "\n" + "{broken\n")
    code, _, err = run_cli(capsys, "verify", "--verifier", "math", "--input", str(src))
    assert_one_line(err, f"{src}:2: invalid JSON")
    assert code == 2


def test_verify_a_lone_surrogate_names_the_line_and_leaves_no_partial_output(capsys, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"completion": "\\boxed{1}", "answer": "1"}) + "\n"
                   + '{"completion": "so \\ud800 \\\\boxed{2}", "answer": "2"}\n')
    out = tmp_path / "out.jsonl"
    code, _, err = run_cli(capsys, "verify", "--verifier", "math", "--input", str(src), "--output", str(out),
                           "--workers", "0")
    assert code == 2
    assert_one_line(err, f"{src}:2", "not valid Unicode", "'\\ud800'")
    assert not out.exists() and not list(tmp_path.glob(".out.jsonl.tmp*"))


def test_verify_output_is_written_whole(capsys, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"completion": f"\\boxed{{{k}}}", "answer": "3"}) + "\n" for k in range(5)))
    out = tmp_path / "out.jsonl"
    code, stdout, _ = run_cli(capsys, "verify", "--verifier", "math", "--input", str(src), "--output", str(out),
                              "--workers", "0")
    assert code == 0 and f"wrote {out}" in stdout
    assert [json.loads(line)["reward"]["score"] for line in out.read_text().splitlines()] == [0, 0, 0, 1, 0]


def test_disk_full_while_checkpointing_names_the_file(tmp_path, monkeypatch):
    """torch.save reports a full disk as "unexpected pos ..." (a RuntimeError without errno)."""
    import errno

    import torch

    from rlvr.run import checkpoint
    from rlvr.verifiers.files import DiskFullError

    class Model:
        def save_pretrained(self, folder):
            Path(folder).mkdir(parents=True)

    def full(*_a, **_k):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 123 vs 456")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    monkeypatch.setattr("rlvr.verifiers.files.shutil.disk_usage", lambda _p: type("U", (), {"free": 0})())
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    tok = Model()
    tok.save_pretrained = lambda folder: None
    with pytest.raises(DiskFullError, match=r"disk full while writing checkpoint .*step_000007 \(no earlier checkpoint "
                                            r"exists\); free some space and continue with --resume"):
        checkpoint.save_checkpoint(tmp_path, 7, models={"policy": Model()}, tokenizer=tok,
                                   states={"optimizer": opt, "scheduler": sched}, extra={})
    assert not list((tmp_path / "checkpoints").iterdir())  # the partial copy is gone

    def enospc(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    from rlvr.run.tracking import Tracker

    tracker = Tracker(tmp_path)
    tracker._file.close()
    tracker._file = type("F", (), {"write": enospc, "flush": lambda self: None, "close": lambda self: None})()
    with pytest.raises(DiskFullError, match=f"disk full while writing {tmp_path / 'metrics.jsonl'}"):
        tracker.log(1, {"x": 1.0})


# ---------------------------------------------------------------------------------------------
# prompts longer than the model's context, broken plugins in listings
# ---------------------------------------------------------------------------------------------


def test_prompts_too_long_for_the_context_are_skipped_or_refused(capsys, tmp_path, tiny_model):
    from transformers import AutoConfig

    context = AutoConfig.from_pretrained(tiny_model).max_position_embeddings
    data = tmp_path / "data.jsonl"
    rows = [{"question": f"{a}+{a}=", "answer": str(2 * a)} for a in range(6)]
    rows.append({"question": "7" * (200 * context), "answer": "1"})  # 200x the context, in characters
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = {"task": "custom", "path": str(data), "options": {"prompt_field": "question", "answer_field": "answer"}}
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run", data=[entry])
    code, out, _ = run_cli(capsys, "train", str(cfg))
    assert code == 0
    assert f"1 of 7 prompts of suite 'custom' are longer than {context - 3} tokens" in out and "skipped" in out
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run2", data=[entry],
                       generation={"max_new_tokens": 3, "overlong_prompts": "error"})
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert code == 2
    assert_one_line(err, "1 of 7 prompts", "custom/", "generation.overlong_prompts=skip")


def test_broken_plugins_are_marked_in_listings_with_the_whole_reason(capsys, monkeypatch):
    from importlib import metadata

    from rlvr.tasks import registry as task_registry
    from rlvr.verifiers import registry as verifier_registry

    reason = "a reason long enough to have been cut mid-word by the old listing, " * 3
    module = type(sys)("broken_listing_plugin")
    monkeypatch.setitem(sys.modules, "broken_listing_plugin", module)

    def getattr_fails(name):
        raise ImportError(reason)

    module.__getattr__ = getattr_fails
    groups = {"rlvr.tasks": "my_broken_suite", "rlvr.verifiers": "my_broken_check"}
    monkeypatch.setattr("rlvr.verifiers.plugins.metadata.entry_points",
                        lambda *, group: [metadata.EntryPoint(groups[group], "broken_listing_plugin:Thing", group)]
                        if group in groups else [])
    for registry_module, attr in [(task_registry, "TASKS"), (verifier_registry, "VERIFIERS")]:
        private = getattr(registry_module, attr).copy()
        private.rescan()
        monkeypatch.setattr(registry_module, attr, private)
    monkeypatch.setattr("rlvr.tasks.TASKS", task_registry.TASKS)
    code, out, _ = run_cli(capsys, "verifiers", "list")
    assert code == 0 and "my_broken_check" in out and "BROKEN" in out and reason.strip() in out
    assert "math" in out  # the others are still listed
    code, out, _ = run_cli(capsys, "tasks", "list", "--no-sizes")
    assert code == 0 and "my_broken_suite" in out and "BROKEN" in out and reason.strip() in out


# ---------------------------------------------------------------------------------------------
# issue 42 item 22: a broken model folder, a hub dataset offline, the right knob, a missing tracker
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("breakage, fragment", [
    (lambda d: (d / "config.json").write_text("{oops"), "config.json is not valid JSON (line 1"),
    (lambda d: (d / "config.json").write_text(json.dumps({"model_type": "nosuch"})), "model_type 'nosuch'"),
    (lambda d: (d / "model.safetensors").unlink(), "it holds no weights (none of model.safetensors"),
    (lambda d: (d / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\nsize 9\n"),
     "model.safetensors is a Git LFS pointer"),
])
def test_a_broken_model_folder_is_one_line_naming_it(capsys, tmp_path, tiny_model, breakage, fragment):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    breakage(model)
    cfg = write_config(tmp_path / "c.yaml", model, tmp_path / "run")
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert code == 2
    assert_one_line(err, f"model.path: {model} is not a usable model folder: ", fragment)


def test_a_truncated_weights_file_or_a_missing_tokenizer_is_one_line(tmp_path, tiny_model):
    import shutil

    from rlvr.modeling.loading import load_policy, load_tokenizer
    from rlvr.verifiers.errors import UserError

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    weights = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(weights[: len(weights) // 2])  # an interrupted download
    with pytest.raises(UserError, match=f"model folder {model}: its weights cannot be loaded"):
        load_policy(model)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    with pytest.raises(UserError, match="is not a usable model folder: it holds no tokenizer"):
        load_tokenizer(model)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_hub_dataset_that_cannot_be_fetched_is_one_line_at_once(capsys, monkeypatch):
    """No five retries and a ConnectionError traceback: the hub is probed first (here: a closed port)."""
    import datasets
    from huggingface_hub import constants

    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    argv = ["tasks", "show", "custom", "--path", "someorg/no-such-data", "--option", "prompt_field=q",
            "--option", "answer_field=a"]
    started = time.perf_counter()
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and time.perf_counter() - started < 10
    assert_one_line(err, "someorg/no-such-data: cannot fetch this Hugging Face dataset", f"hub ({endpoint})",
                    "pass path= a local copy", "HF_HUB_OFFLINE=1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # offline mode: the cache only
    code, _, err = run_cli(capsys, *argv)
    assert_one_line(err, "someorg/no-such-data: this Hugging Face dataset is not in the datasets cache",
                    "pass path= a local copy")


def test_an_episode_budget_too_long_for_the_context_names_its_own_key(capsys, tmp_path, tiny_model):
    from transformers import AutoConfig

    context = AutoConfig.from_pretrained(tiny_model).max_position_embeddings
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run",
                       data=[{"task": "tool_arithmetic", "limit": 4}],
                       environment={"max_episode_tokens": context + 10, "messages": "text"})
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert code == 2
    assert_one_line(err, f"environment.max_episode_tokens ({context + 10}) leaves no room for a prompt")
    assert "generation.max_new_tokens" not in err


@pytest.mark.parametrize("flag", ["wandb", "tensorboard"])
def test_a_tracker_without_its_package_fails_at_config_load(capsys, tmp_path, tiny_model, flag):
    import importlib.util

    from rlvr.run.tracking import Tracker
    from rlvr.verifiers.errors import UserError

    if importlib.util.find_spec(flag) is not None:
        pytest.skip(f"{flag} is installed here")
    cfg = write_config(tmp_path / "c.yaml", tiny_model, tmp_path / "run")
    code, _, err = run_cli(capsys, "train", str(cfg), f"log.{flag}=true")
    assert code == 2 and not (tmp_path / "run").exists()
    assert_one_line(err, f"(override log.{flag}=true): log.{flag}: the {flag} package is not installed",
                    "pip install 'rlvr[tracking]'")
    with pytest.raises(UserError, match=f"log.{flag}: the {flag} package is not installed"):
        Tracker(tmp_path / "direct", **{flag: True})
    assert not (tmp_path / "direct").exists()


def test_the_wandb_run_is_named_by_the_config(tmp_path, monkeypatch):
    """log.wandb_project, wandb_entity and wandb_name reach wandb.init (a stand-in module: wandb is an extra)."""
    import importlib.machinery
    import sys
    import types

    from rlvr.config import RunLogConfig
    from rlvr.run.tracking import Tracker

    calls = []
    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # found by the installed-check
    fake.init = lambda **kwargs: calls.append(kwargs) or types.SimpleNamespace(log=lambda *a, **k: None,
                                                                               finish=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    log = RunLogConfig(wandb=True, wandb_project="p", wandb_entity="team", wandb_name="try-3")
    config = types.SimpleNamespace(log=log, model_dump=lambda mode: {"log": {}})
    Tracker.for_run(tmp_path / "run", config).close()
    assert calls[0]["project"] == "p" and calls[0]["entity"] == "team" and calls[0]["name"] == "try-3"


def test_a_hub_id_is_read_from_the_hub_cache(capsys, tmp_path, tiny_model, monkeypatch):
    """``model.path: owner/name`` that is not a local folder is the hub's model: huggingface_hub's cache
    serves it (here an offline cache laid out as the hub writes it, with HF_HUB_OFFLINE=1), the run
    trains from it, and an id the cache lacks fails in one line naming the field."""
    import shutil

    cache = tmp_path / "hf" / "hub"
    snapshot = cache / "models--someorg--tiny" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_model, snapshot)
    (cache / "models--someorg--tiny" / "refs").mkdir()
    (cache / "models--someorg--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))  # read at import: follow the variables
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    from rlvr.modeling.loading import check_model_folder

    assert check_model_folder("someorg/tiny", contents=True) == snapshot
    monkeypatch.chdir(tmp_path)  # (no local folder of that name)
    cfg = write_config(tmp_path / "c.yaml", "someorg/tiny", tmp_path / "run")
    assert run_cli(capsys, "train", str(cfg), "train.steps=1")[0] == 0
    assert (tmp_path / "run" / "final" / "config.json").is_file()
    cfg = write_config(tmp_path / "c.yaml", "someorg/absent", tmp_path / "run2")
    code, _, err = run_cli(capsys, "train", str(cfg))
    assert_one_line(err, "model.path: no model at someorg/absent", "not in the hub cache", "hf download someorg/absent")

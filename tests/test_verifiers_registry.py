"""The plugin system: @register_verifier, entry-point discovery (rlvr.verifiers), options, errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlvr import verifiers
from rlvr.verifiers import Reward, Verifier, describe_verifier, get_verifier, list_verifiers, register_verifier
from rlvr.verifiers import registry
from rlvr.verifiers.runner import VerifierRunner

ROOT = Path(__file__).resolve().parents[1]
BUILT_INS = {"numeric", "math", "format", "length", "repetition", "compose", "trl"}


@pytest.fixture
def clean_registry(monkeypatch):
    """A private copy of the registry, with entry points not yet loaded."""
    private = registry.VERIFIERS.copy()
    private.rescan()
    monkeypatch.setattr(registry, "VERIFIERS", private)


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch, clean_registry):
    """A tiny installed-looking distribution declaring two rlvr.verifiers entry points."""
    (tmp_path / "plugpkg").mkdir()
    (tmp_path / "plugpkg" / "__init__.py").write_text(textwrap.dedent('''
        from rlvr.verifiers import Reward, Verifier

        class Plugin(Verifier):
            description = "a test plugin: bonus when the completion says yes"

            def __init__(self, bonus: float = 1.0):
                self.bonus = bonus

            def score(self, completion, reference):
                return Reward(self.bonus if "yes" in completion else 0.0)
    '''))
    dist = tmp_path / "plugpkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugpkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[rlvr.verifiers]\nplug_test = plugpkg:Plugin\nplug_broken = plugpkg_missing:Nope\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_built_ins_are_registered():
    assert BUILT_INS <= set(list_verifiers())


def test_register_verifier_in_process(clean_registry):
    @register_verifier("my_check")
    class MyCheck(Verifier):
        def __init__(self, word: str = "yes"):
            self.word = word

        def score(self, completion, reference):
            return Reward(float(self.word in completion))

    assert MyCheck.name == "my_check"
    assert get_verifier("my_check").score("yes!", {}).score == 1.0
    assert get_verifier("my_check", word="ok").score("yes!", {}).score == 0.0
    with pytest.raises(ValueError, match="already registered"):
        register_verifier("my_check")(type("Other", (Verifier,), {}))
    register_verifier("my_check", overwrite=True)(type("Other", (Verifier,), {"score": lambda s, c, r: Reward(0.5)}))
    assert get_verifier("my_check").score("", {}).score == 0.5


def test_options_come_from_config():
    assert get_verifier("math", tolerance=1e-4).tolerance.relative == 1e-4
    with pytest.raises(TypeError, match="valid options: tolerance"):
        get_verifier("math", tolerence=1e-6)


def test_unknown_name_lists_the_registered_ones():
    with pytest.raises(KeyError) as err:
        get_verifier("mathh")
    for name in BUILT_INS:
        assert name in str(err.value)


def test_entry_point_discovery(plugin_dir):
    names = list_verifiers()
    assert {"plug_test", "plug_broken"} <= set(names)
    plugin = get_verifier("plug_test", bonus=2.0)
    assert plugin.score("yes", {}).score == 2.0
    with pytest.raises(TypeError, match="valid options: bonus"):
        get_verifier("plug_test", bonsu=2.0)
    with pytest.raises(ImportError, match="plug_broken"):  # a broken plugin fails alone, loudly
        get_verifier("plug_broken")
    assert get_verifier("math").score(r"\boxed{1}", {"answer": "1"}).score == 1.0
    assert describe_verifier("plug_test")["description"].startswith("a test plugin")


def test_plugin_scores_in_a_worker_process(plugin_dir):
    with VerifierRunner(workers=1, timeout_s=5) as runner:
        rewards = runner.score_batch("plug_test", ["yes", "no"], [{}, {}], {"bonus": 3.0})
    assert [(r.score, r.status) for r in rewards] == [(3.0, "ok"), (0.0, "ok")]


def test_entry_point_discovery_in_a_fresh_interpreter(plugin_dir):
    code = ("import sys; from rlvr import verifiers; names = verifiers.list_verifiers(); "
            "assert 'plug_test' in names, names; assert 'torch' not in sys.modules; "
            "print(verifiers.get_verifier('plug_test').score('yes', {}).score)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": f"{plugin_dir}:{ROOT}", "PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == "1.0"


def test_describe_verifier_lists_options_with_defaults():
    d = describe_verifier("math")
    assert d["options"]["tolerance"] == 1e-6 and d["options"]["fallback"] == "last_number"
    assert describe_verifier("compose")["options"]["parts"] == "<required>"
    assert all(describe_verifier(n)["description"] for n in BUILT_INS)


def test_verifiers_package_exports():
    for name in ("Verifier", "Reward", "register_verifier", "get_verifier", "list_verifiers", "from_trl",
                 "register_trl_reward"):
        assert hasattr(verifiers, name)

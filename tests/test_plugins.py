"""The one registry behind every extension point (rlvr.verifiers.plugins), and the algorithm
pieces as plugins: a new advantage estimator, policy loss, aggregation or KL estimator is valid in a
config as soon as it is registered, by decorator or by entry point."""

from __future__ import annotations

import sys
import types
from importlib import metadata

import pytest
import torch

from rlvr.algorithms import advantages, losses
from rlvr.config import ConfigError, RunConfig, build_config
from rlvr.verifiers.errors import OptionError, PluginLoadError, UnknownNameError, UserError
from rlvr.verifiers.plugins import Registry, check_options

BASE = {"model": {"path": "some/model"}}


def _entry_points(group_wanted: str, *pairs: tuple[str, str]):
    def entry_points(*, group):
        if group != group_wanted:
            return []
        return [metadata.EntryPoint(name=n, value=v, group=group) for n, v in pairs]

    return entry_points


def test_decorator_lazy_and_unknown_names():
    reg = Registry("widget")
    reg.register("a")(len)
    reg.lazy("b", "json:dumps")
    assert reg.names() == ["a", "b"] and "b" in reg and "c" not in reg
    assert reg.get("a") is len and reg["b"].__name__ == "dumps"
    with pytest.raises(UnknownNameError, match="unknown widget 'c'; valid widgets: a, b") as err:
        reg.get("c")
    assert isinstance(err.value, KeyError) and isinstance(err.value, UserError)
    assert str(err.value).startswith("unknown widget")  # no KeyError quotes
    assert reg.check("a") == "a"
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", max)
    reg.register("a", max, overwrite=True)
    assert reg.get("a") is max


def test_a_lazy_built_in_with_a_missing_package_gives_the_install_hint():
    reg = Registry("engine")
    reg.lazy("fancy", "no_such_engine_pkg.engine:Engine", install="pip install 'rlvr[fancy]'")
    assert reg.names() == ["fancy"]  # listing imports nothing
    with pytest.raises(PluginLoadError, match=r"engine 'fancy' needs a package that is not installed .*"
                                              r"install it with: pip install 'rlvr\[fancy\]'"):
        reg.get("fancy")
    ok, reason = reg.status("fancy")
    assert not ok and "No module named 'no_such_engine_pkg'" in reason


def test_entry_points_are_listed_without_import_and_loaded_on_use(monkeypatch):
    module = types.ModuleType("fake_widget_plugin")
    module.widget = lambda: "made"
    monkeypatch.setitem(sys.modules, "fake_widget_plugin", module)
    monkeypatch.setattr("rlvr.verifiers.plugins.metadata.entry_points",
                        _entry_points("rlvr.widgets", ("good", "fake_widget_plugin:widget"),
                                      ("bad", "fake_widget_plugin:missing_attr")))
    reg = Registry("widget", entry_point_group="rlvr.widgets")
    assert reg.names() == ["bad", "good"]
    assert reg.get("good")() == "made"
    with pytest.raises(PluginLoadError, match=r"widget 'bad' \(fake_widget_plugin:missing_attr, entry point\) failed "
                                              r"to load: AttributeError"):
        reg.get("bad")
    assert reg.status("bad")[0] is False and reg.status("good") == (True, "")
    assert [name for name, _ in reg.items()] == ["good"]


def test_check_options_names_the_plugin_and_the_valid_options():
    def factory(*, alpha=1, beta=2):
        return None

    check_options("widget 'w'", factory, {"alpha": 3})
    with pytest.raises(OptionError, match="widget 'w': unknown option\\(s\\) gamma; valid options: alpha, beta"):
        check_options("widget 'w'", factory, {"gamma": 3})
    check_options("widget 'w'", lambda **kw: None, {"anything": 1})  # **kwargs takes anything


@pytest.fixture
def private_algorithm_registries(monkeypatch):
    for module, name in [(advantages, "ADVANTAGE_ESTIMATORS"), (losses, "POLICY_LOSSES"),
                         (losses, "LOSS_AGGREGATIONS"), (losses, "KL_ESTIMATORS")]:
        monkeypatch.setattr(module, name, getattr(module, name).copy())


def test_a_registered_advantage_estimator_is_valid_in_the_config(private_algorithm_registries):
    with pytest.raises(ConfigError, match="algorithm.advantage: unknown advantage estimator 'median'"):
        build_config(RunConfig, BASE, ["algorithm.advantage=median"])

    @advantages.ADVANTAGE_ESTIMATORS.register("median")
    def median_baseline(rewards, valid=None):
        return rewards - rewards.median(dim=1, keepdim=True).values

    config = build_config(RunConfig, BASE, ["algorithm.advantage=median"])
    estimator = advantages.ADVANTAGE_ESTIMATORS[config.algorithm.advantage]
    assert estimator(torch.tensor([[0.0, 1.0, 1.0]])).tolist() == [[-1.0, 0.0, 0.0]]


def test_an_entry_point_policy_loss_is_valid_in_the_config_and_used(private_algorithm_registries, monkeypatch):
    module = types.ModuleType("fake_loss_plugin")

    def doubled(logp, old_logp, advantages, **_):
        loss = -2.0 * advantages.unsqueeze(-1) * torch.exp(logp - old_logp)
        never = torch.zeros_like(loss, dtype=torch.bool)
        return loss, never, never

    module.doubled = doubled
    monkeypatch.setitem(sys.modules, "fake_loss_plugin", module)
    monkeypatch.setattr("rlvr.verifiers.plugins.metadata.entry_points",
                        _entry_points("rlvr.policy_losses", ("doubled", "fake_loss_plugin:doubled")))
    losses.POLICY_LOSSES.rescan()
    config = build_config(RunConfig, BASE, ["algorithm.policy_loss=doubled"])
    logp = torch.zeros(1, 2)
    loss, _ = losses.policy_loss(logp, logp, torch.tensor([1.0]), torch.ones(1, 2), loss=config.algorithm.policy_loss,
                                 agg="token_mean")
    assert loss.item() == pytest.approx(-2.0)


def test_vanilla_policy_gradient_by_hand():
    """l_t = -rho_t * A, never clipped: rho = e^{0.5} and e^{-1} with A = 2 and -1."""
    logp = torch.tensor([[0.5], [-1.0]])
    old = torch.zeros(2, 1)
    loss_t, low, high = losses.POLICY_LOSSES["vanilla"](logp, old, torch.tensor([2.0, -1.0]), clip_low=0.2, clip_high=0.2)
    assert torch.allclose(loss_t, torch.tensor([[-2.0 * 1.6487213], [0.3678794]]))
    assert not low.any() and not high.any()  # far outside the trust region, still not clipped
    logp.requires_grad_(True)
    loss, _ = losses.policy_loss(logp, logp.detach(), torch.tensor([2.0, -1.0]), torch.ones(2, 1), loss="vanilla",
                                 agg="token_mean")
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0], [0.5]]))  # -A / N at rho = 1


def test_every_algorithm_config_field_lists_its_registry_on_error():
    for field, registry_kind in [("advantage", "advantage estimators"), ("policy_loss", "policy losses"),
                                 ("loss_agg", "loss aggregations"), ("kl_estimator", "KL estimators")]:
        with pytest.raises(ConfigError, match=f"algorithm.{field}: unknown .* 'nope'; valid {registry_kind}: "):
            build_config(RunConfig, BASE, [f"algorithm.{field}=nope"])
    with pytest.raises(ConfigError, match="engine.name: unknown engine 'nope'; valid engines: hf"):
        build_config(RunConfig, BASE, ["engine.name=nope"])

"""The connector asks third-party plugins: "auto" priority and availability, pins, strategy fallback."""

from __future__ import annotations

import os

import pytest

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from lightning.pytorch.accelerators import CPUAccelerator  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy  # noqa: E402
from plugin_helpers import make_plugin  # noqa: E402

import trainer_plugins  # noqa: E402
from trainer_plugins import AcceleratorEntry, PluginError, PluginWarning, StrategyEntry  # noqa: E402

FAKE = "fake_accelerators:FakeAccelerator"


def accelerator_plugin(name: str, priority, available, **hooks):
    def probe(name_asked):
        if name_asked != name:
            return None
        if isinstance(available, Exception):
            raise available
        return available

    return make_plugin(
        accelerators=lambda: [AcceleratorEntry(name, trainer=FAKE, auto_priority=priority)],
        accelerator_available=lambda name: probe(name),
        **hooks,
    )


def auto_accelerator() -> str:
    return L.Trainer(logger=False)._accelerator_connector.plugin_connector.explanation.as_dicts()[0]["choice"]


def test_auto_picks_the_available_plugin_accelerator_with_the_highest_priority(extra_plugins):
    extra_plugins("low", accelerator_plugin("low_npu", 5, True))
    extra_plugins("high", accelerator_plugin("high_npu", 50, True))
    extra_plugins("absent", accelerator_plugin("absent_npu", 500, False))
    assert auto_accelerator().startswith("high_npu ")


def test_an_unavailable_plugin_accelerator_leaves_auto_to_lightnings_choice(extra_plugins):
    extra_plugins("absent", accelerator_plugin("absent_npu", 500, False))
    assert auto_accelerator().startswith("cpu ")


def test_a_probe_that_raises_makes_its_plugin_not_available_for_that_run_and_auto_goes_on(extra_plugins):
    extra_plugins("broken", accelerator_plugin("broken_npu", 500, OSError("driver missing")), "broken-dist", "0.3")
    with pytest.warns(
        PluginWarning,
        match=r"plugin broken \(broken-dist 0.3\) is not available for this run: failed in"
        r" trainer_plugins_accelerator_available: OSError: driver missing",
    ):
        assert auto_accelerator().startswith("cpu ")
    record = trainer_plugins.get_plugin_manager().records["broken"]
    assert (record.state, record.unavailable) == (
        "loaded",
        "failed in trainer_plugins_accelerator_available: OSError: driver missing",
    )
    with (
        pytest.warns(PluginWarning),
        pytest.raises(
            PluginError,
            match=r"plugin broken \(broken-dist 0.3\) cannot provide accelerator 'broken_npu': failed in"
            r" trainer_plugins_accelerator_available: OSError: driver missing",
        ),
    ):
        L.Trainer(accelerator="broken_npu", logger=False)


def test_a_transient_probe_failure_is_forgotten_by_the_next_run(extra_plugins):
    answers = [OSError("PJRT_DEVICE not set yet"), True]

    def probe(name):
        if name != "later_npu":
            return None
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    extra_plugins(
        "later",
        make_plugin(
            accelerators=lambda: [AcceleratorEntry("later_npu", trainer=FAKE, auto_priority=500)],
            accelerator_available=probe,
        ),
    )
    with pytest.warns(PluginWarning, match="OSError: PJRT_DEVICE not set yet"):
        assert auto_accelerator().startswith("cpu ")
    assert auto_accelerator().startswith("later_npu ")
    assert answers == []


def test_a_probe_that_never_answers_is_abandoned_after_the_probe_timeout(extra_plugins, monkeypatch):
    import dataclasses
    import threading
    import time

    release = threading.Event()
    extra_plugins(
        "wedged",
        make_plugin(
            accelerators=lambda: [AcceleratorEntry("wedged_npu", trainer=FAKE, auto_priority=500)],
            accelerator_available=lambda name: release.wait(60) if name == "wedged_npu" else None,
        ),
    )
    manager = trainer_plugins.get_plugin_manager()
    monkeypatch.setattr(manager, "controls", dataclasses.replace(manager.controls, probe_timeout=0.2))
    started = time.perf_counter()
    try:
        with pytest.warns(PluginWarning, match=r"wedged \(test-dist 1.0\) is not available for this run: failed in"):
            assert auto_accelerator().startswith("cpu ")
        # the earlier call still hangs: the next run does not wait again
        with pytest.warns(PluginWarning, match="a call from an earlier run has still not answered"):
            assert auto_accelerator().startswith("cpu ")
        assert time.perf_counter() - started < 5
    finally:
        release.set()


def test_a_pin_decides_what_auto_means(extra_plugins, monkeypatch):
    extra_plugins("high", accelerator_plugin("high_npu", 50, True))
    monkeypatch.setenv("TRAINER_PLUGINS_PIN_ACCELERATOR", "cpu")
    rows = L.Trainer(logger=False)._accelerator_connector.plugin_connector.explanation.as_dicts()
    assert rows[0] == {
        "role": "accelerator",
        "choice": "cpu (lightning.pytorch.accelerators.cpu.CPUAccelerator)",
        "plugin": "controls",
        "reason": "pinned by TRAINER_PLUGINS_PIN_ACCELERATOR",
    }


def test_a_pin_naming_nothing_is_rejected(monkeypatch):
    monkeypatch.setenv("TRAINER_PLUGINS_PIN_STRATEGY", "warp_drive")
    with pytest.raises(
        ValueError, match="TRAINER_PLUGINS_PIN_STRATEGY='warp_drive' names no strategy; choose one of ddp"
    ):
        L.Trainer(accelerator="cpu", logger=False)


def test_a_plugin_accelerator_whose_plugin_chooses_no_strategy_runs_on_its_own_device(extra_plugins):
    extra_plugins("npu", accelerator_plugin("npu", None, True))
    one = L.Trainer(accelerator="npu", devices=1, logger=False)
    assert type(one.strategy) is SingleDeviceStrategy and one.strategy.root_device == torch.device("cpu")
    two = L.Trainer(accelerator="npu", devices=2, logger=False)
    assert type(two.strategy) is DDPStrategy and len(two.strategy.parallel_devices) == 2


def test_a_plugin_chooses_the_strategy_for_its_accelerator(extra_plugins):
    def select(accelerator, parallel_devices):
        from fake_accelerators import FakeAccelerator

        return "ddp_spawn" if isinstance(accelerator, FakeAccelerator) else None

    extra_plugins("npu", accelerator_plugin("npu", None, True, select_strategy=select))
    trainer = L.Trainer(accelerator="npu", devices=2, logger=False)
    assert trainer.strategy._start_method == "spawn"
    row = trainer._accelerator_connector.plugin_connector.explanation.as_dicts()[3]
    assert row["role"] == "strategy" and row["plugin"] == "npu (test-dist 1.0)"
    assert os.environ.get("TRAINER_PLUGINS_PIN_STRATEGY") is None


class OwnSingleDevice(SingleDeviceStrategy):
    """A plugin's strategy that a Lightning check of its own would refuse."""


def refusal_plugin(answer):
    """Declares ``own_single`` and answers ``answer`` to every refusal of a pair that holds one of its strategies."""
    return make_plugin(
        strategies=lambda: [StrategyEntry("own_single", trainer="test_connector_plugins:OwnSingleDevice")],
        accept_lightning_refusal=lambda strategy: answer if isinstance(strategy, OwnSingleDevice) else None,
    )


def test_the_plugin_of_the_strategy_accepts_lightnings_refusal_of_it(extra_plugins):
    extra_plugins("own", refusal_plugin(True))
    connector = trainer_plugins.Connector("trainer")
    refusal, cpu = ValueError("Lightning's last check refused the pair"), torch.device("cpu")
    assert connector.accepts_lightning_refusal(refusal, CPUAccelerator(), OwnSingleDevice(device=cpu)) is True
    assert connector.accepts_lightning_refusal(refusal, CPUAccelerator(), SingleDeviceStrategy(device=cpu)) is False


def test_a_plugin_the_pair_does_not_belong_to_is_not_heard_and_an_owners_false_stands(extra_plugins):
    extra_plugins("bystander", make_plugin(accept_lightning_refusal=lambda: True))
    connector = trainer_plugins.Connector("trainer")
    refusal, cpu = ValueError("Lightning's last check refused the pair"), torch.device("cpu")
    assert connector.accepts_lightning_refusal(refusal, CPUAccelerator(), SingleDeviceStrategy(device=cpu)) is False
    extra_plugins("own", refusal_plugin(False))
    connector = trainer_plugins.Connector("trainer")
    assert connector.accepts_lightning_refusal(refusal, CPUAccelerator(), OwnSingleDevice(device=cpu)) is False


class NpuDDP(DDPStrategy):
    """A plugin's DDP for its accelerator."""


def names_plugin(asked: list, answer=None):
    """Owns accelerator ``npu`` and strategy ``npu_ddp``; says Lightning's ``"ddp"``/``"fsdp"`` mean ``npu_ddp`` on it.

    Each question is appended to ``asked``; ``answer`` (a name, or an exception to raise) replaces the plugin's own.
    """

    def strategy_for_name(name, accelerator, api):
        from fake_accelerators import FakeAccelerator

        if not isinstance(accelerator, FakeAccelerator):
            return None
        asked.append((name, api))
        if isinstance(answer, Exception):
            raise answer
        return answer or ("npu_ddp" if name in ("ddp", "fsdp") else None)

    return make_plugin(
        api=">=1.3,<2",
        accelerators=lambda: [AcceleratorEntry("npu", trainer=FAKE, fabric=FAKE)],
        strategies=lambda: [
            StrategyEntry(
                "npu_ddp",
                trainer="test_connector_plugins:NpuDDP",
                fabric="lightning.fabric.strategies:DDPStrategy",
                distributed=True,
            )
        ],
        strategy_for_name=strategy_for_name,
    )


def test_the_accelerators_plugin_says_what_lightnings_strategy_name_means_on_it(extra_plugins):
    asked: list = []
    extra_plugins("npu", names_plugin(asked))
    trainer = L.Trainer(accelerator="npu", devices=2, strategy="ddp", logger=False)
    assert type(trainer.strategy) is NpuDDP and len(trainer.strategy.parallel_devices) == 2
    row = next(
        d for d in trainer._accelerator_connector.plugin_connector.explanation.as_dicts() if d["role"] == "strategy"
    )
    assert row["plugin"] == "npu (test-dist 1.0)"
    assert row["reason"].startswith("Lightning's name 'ddp' on fake_accelerators.FakeAccelerator")
    # a name Lightning keeps for itself: the plugin answers None, Lightning's class runs
    assert type(L.Trainer(accelerator="npu", devices=2, strategy="ddp_spawn", logger=False).strategy) is DDPStrategy
    # Lightning's own accelerator: the plugin is asked nothing it answers
    assert type(L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False).strategy) is DDPStrategy
    assert asked == [("ddp", "trainer"), ("ddp_spawn", "trainer")]


def test_fsdp_by_name_reaches_the_plugins_strategy_before_lightnings_gpu_only_check(extra_plugins):
    asked: list = []
    extra_plugins("npu", names_plugin(asked))
    assert type(L.Trainer(accelerator="npu", devices=2, strategy="fsdp", logger=False).strategy) is NpuDDP
    fabric = L.Fabric(accelerator="npu", devices=2, strategy="fsdp")
    assert type(fabric.strategy).__name__ == "DDPStrategy" and fabric.strategy.__module__.startswith("lightning.fabric")
    assert asked == [("fsdp", "trainer"), ("fsdp", "fabric")]


def test_a_pin_an_instance_and_a_plugins_own_name_are_used_as_given_unasked(extra_plugins, monkeypatch):
    asked: list = []
    extra_plugins("npu", names_plugin(asked))
    mine = DDPStrategy()
    assert L.Trainer(accelerator="npu", devices=2, strategy=mine, logger=False).strategy is mine
    assert type(L.Trainer(accelerator="npu", devices=2, strategy="npu_ddp", logger=False).strategy) is NpuDDP
    monkeypatch.setenv("TRAINER_PLUGINS_PIN_STRATEGY", "ddp")
    assert type(L.Trainer(accelerator="npu", devices=2, logger=False).strategy) is DDPStrategy
    assert asked == []


def test_the_plugins_refusal_of_a_name_reaches_the_user_naming_the_plugin(extra_plugins):
    extra_plugins("npu", names_plugin([], answer=ValueError("strategy='ddp' cannot run on npu: use 'npu_ddp'")))
    with pytest.raises(ValueError, match=r"^strategy='ddp' cannot run on npu: use 'npu_ddp'") as info:
        L.Trainer(accelerator="npu", devices=2, strategy="ddp", logger=False)
    if hasattr(info.value, "add_note"):  # Python >= 3.11: the plugin is named in a note
        assert info.value.__notes__ == ["raised by plugin npu (test-dist 1.0)"]


def test_a_name_answered_that_no_strategy_has_is_the_plugins_error(extra_plugins):
    extra_plugins("npu", names_plugin([], answer="warp_ddp"))
    with pytest.raises(
        PluginError,
        match=r"plugin npu \(test-dist 1.0\) answered trainer_plugins_strategy_for_name\('ddp'\) with 'warp_ddp',"
        r" which names no strategy of lightning.Trainer; registered: ddp, ",
    ):
        L.Trainer(accelerator="npu", devices=2, strategy="ddp", logger=False)

"""Lightning's own accelerators behave exactly as in plain Lightning when they go through our connector."""

from __future__ import annotations

import warnings

import pytest

L = pytest.importorskip("lightning")
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector  # noqa: E402

from trainer_plugins import TrainerConnector  # noqa: E402


def signature(connector) -> dict:
    """What a run gets from a connector, in comparable form."""
    strategy = connector.strategy
    return {
        "accelerator": type(connector.accelerator),
        "strategy": type(strategy),
        "start_method": getattr(strategy, "_start_method", None),
        "ddp_kwargs": getattr(strategy, "_ddp_kwargs", None),
        "parallel_devices": getattr(strategy, "parallel_devices", None),
        "root_device": strategy.root_device,
        "num_nodes": getattr(strategy, "num_nodes", None),
        "launcher": type(strategy.launcher),
        "precision": (type(connector.precision_plugin), getattr(connector.precision_plugin, "precision", None)),
        "environment": type(connector.cluster_environment),
        "is_distributed": connector.is_distributed,
    }


def outcome(connector_class, flags_factory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return signature(connector_class(**flags_factory()))
        except Exception as error:
            return (type(error), str(error))


CASES = {
    "cpu": lambda: dict(accelerator="cpu"),
    "auto": lambda: dict(),
    "cpu, 2 devices": lambda: dict(accelerator="cpu", devices=2),
    "ddp_spawn": lambda: dict(accelerator="cpu", devices=2, strategy="ddp_spawn"),
    "ddp_fork": lambda: dict(accelerator="cpu", devices=2, strategy="ddp_fork"),
    "find unused": lambda: dict(accelerator="cpu", devices=3, strategy="ddp_find_unused_parameters_true"),
    "ddp instance": lambda: dict(accelerator="cpu", devices=2, strategy=DDPStrategy(static_graph=True)),
    "2 nodes": lambda: dict(accelerator="cpu", num_nodes=2),
    "single_device": lambda: dict(accelerator="cpu", strategy="single_device"),
    "bf16-mixed": lambda: dict(accelerator="cpu", precision="bf16-mixed"),
    "16-mixed falls back": lambda: dict(accelerator="cpu", precision="16-mixed"),
    "bf16-true": lambda: dict(accelerator="cpu", precision="bf16-true"),
    "64-true": lambda: dict(accelerator="cpu", precision="64-true"),
    "legacy 16": lambda: dict(accelerator="cpu", precision=16),
    "cuda missing": lambda: dict(accelerator="cuda"),
    "gpu missing": lambda: dict(accelerator="gpu"),
    "fsdp on cpu": lambda: dict(accelerator="cpu", strategy="fsdp"),
    "zero devices": lambda: dict(accelerator="cpu", devices=0),
    "bad precision": lambda: dict(accelerator="cpu", precision="8-true"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_builtin_flags_give_what_plain_lightning_gives(case):
    ours, lightnings = outcome(TrainerConnector, CASES[case]), outcome(_AcceleratorConnector, CASES[case])
    assert ours == lightnings


def test_a_one_device_strategy_with_several_devices_names_both_flags():
    with pytest.raises(ValueError, match=r"`strategy='single_device'` drives one device, but `devices=2` selects 2"):
        L.Trainer(accelerator="cpu", devices=2, strategy="single_device", logger=False)


@pytest.mark.parametrize(
    ("api", "strategy", "other"),
    [("trainer", "xla_fsdp", "Fabric"), ("fabric", "xla_debug", "Trainer"), ("fabric", "single_device", "Trainer")],
)
def test_a_strategy_name_of_the_other_api_says_whose_it_is(api, strategy, other):
    from trainer_plugins import explain

    with pytest.raises(ValueError) as info:
        explain(api, accelerator="cpu", strategy=strategy)
    message = str(info.value)
    mine = "Fabric" if other == "Trainer" else "Trainer"
    assert message.startswith(f"`strategy={strategy!r}` is for the {other} only: ")  # Lightning's or a plugin's name
    assert f"provides no {mine} class for this strategy. Use it with lightning.{other}, " in message
    assert "invalid strategy name" not in message
    assert f"choose one of the {mine}'s names: auto, " in message and f", {strategy}," not in message


def test_an_unknown_name_is_still_reported_as_unknown():
    from trainer_plugins import explain

    with pytest.raises(ValueError, match=r"You selected an invalid strategy name: `strategy='warp_drive'`"):
        explain("fabric", accelerator="cpu", strategy="warp_drive")

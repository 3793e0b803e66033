"""The connector with the XLA plugin, in this process (one PJRT CPU device): flags -> objects or errors."""

from __future__ import annotations

import warnings

import pytest

pytestmark = pytest.mark.xla

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402

import trainer_plugins  # noqa: E402

PRECISIONS = ("'32-true', '16-true', 'bf16-true'",)


def build(**flags):
    flags.setdefault("logger", False)
    return L.Trainer(**flags)


def kinds(trainer):
    return (
        type(trainer.accelerator).__name__,
        type(trainer.strategy).__name__,
        type(trainer.precision_plugin).__name__,
    )


def test_a_registered_name_and_an_instance_give_the_same_objects():
    from xla_plugins import XLAAccelerator

    by_name, by_instance = build(accelerator="xla", devices=1), build(accelerator=XLAAccelerator(), devices=1)
    assert kinds(by_name) == kinds(by_instance) == ("XLAAccelerator", "SingleDeviceXLAStrategy", "XLAPrecision")
    assert by_name.strategy.root_device == by_instance.strategy.root_device == torch.device("xla", 0)


@pytest.mark.parametrize("strategy", ["auto", "single_xla"])
@pytest.mark.parametrize("devices", [1, [0], "1", "0,", "auto"])
def test_a_single_device_strategy_always_runs_on_the_accelerators_device(devices, strategy):
    trainer = build(accelerator="tpu", devices=devices, strategy=strategy)
    assert type(trainer.strategy).__module__ == "xla_plugins.strategies.single_xla"
    assert trainer.strategy.root_device == torch.device("xla", 0)


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [
        (None, torch.float32),
        ("32-true", torch.float32),
        (32, torch.float32),
        ("16-true", torch.float16),
        ("bf16-true", torch.bfloat16),
    ],
)
def test_the_three_true_precisions_are_accepted(precision, dtype):
    plugin = build(accelerator="xla", devices=1, precision=precision).precision_plugin
    assert type(plugin).__module__ == "xla_plugins.roles.precision"
    assert plugin._desired_dtype == dtype


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed", "64-true", 16, "16", "bf16"])
def test_other_precisions_are_rejected_naming_the_value_and_the_accepted_ones(precision):
    expected = f"`precision={precision!r}` is not supported on XLA. Choose one of '32-true', '16-true', 'bf16-true'"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning warns about the legacy spellings first
        with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            build(accelerator="xla", devices=1, precision=precision)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn", "ddp_fork", DDPStrategy()])
def test_the_xla_accelerator_rejects_non_xla_strategies_naming_the_one_found(strategy):
    with pytest.raises(ValueError, match="The XLA accelerator cannot run strategy DDPStrategy. Use strategy='auto'"):
        build(accelerator="xla", devices=1, strategy=strategy)


def test_xla_strategies_reject_a_non_xla_accelerator():
    with pytest.raises(ValueError, match="runs on XLA devices only, but the accelerator is CPUAccelerator"):
        build(accelerator="cpu", devices=1, strategy="single_xla")


def test_the_multi_device_strategy_on_one_device_points_to_the_single_device_strategy():
    with pytest.raises(NotImplementedError, match="cannot run on a single device. Use strategy='single_xla'"):
        build(accelerator="xla", devices=1, strategy="xla")


def test_an_unknown_accelerator_name_lists_every_registered_name_including_plugin_ones():
    with pytest.raises(
        ValueError, match=r"You selected an invalid accelerator name: `accelerator='npu'`\. Available names are: auto, "
    ) as info:
        build(accelerator="npu")
    listed = str(info.value).split("Available names are: ", 1)[1].rstrip(".").split(", ")
    assert sorted(listed) == [
        "auto",
        "cpu",
        "cuda",
        "mps",
        "tpu",
        "xla",
    ]  # Lightning's names and the plugin's, once each


def test_an_unknown_strategy_name_lists_every_registered_name_including_plugin_ones():
    with pytest.raises(
        ValueError,
        match=r"You selected an invalid strategy name: `strategy='fastest'`\. .* Strategies from installed plugins: .*",
    ) as info:
        build(accelerator="xla", strategy="fastest")
    assert str(info.value).endswith("xla_spmd.")


def test_the_legacy_single_tpu_name_warns_and_gives_the_single_device_xla_strategy():
    with pytest.deprecated_call(
        match="The strategy name 'single_tpu' is deprecated. Use `strategy='single_xla'` instead."
    ):
        trainer = build(accelerator="tpu", devices=1, strategy="single_tpu")
    assert type(trainer.strategy).__module__ == "xla_plugins.strategies.single_xla"


def test_legacy_classes_warn_and_work():
    import xla_plugins

    with pytest.deprecated_call(match="`TPUAccelerator` is deprecated"):
        accelerator = xla_plugins.TPUAccelerator()
    with pytest.deprecated_call(match="`SingleTPUStrategy` .* is deprecated"):
        strategy = xla_plugins.SingleTPUStrategy(device=torch.device("xla", 0))
    with pytest.deprecated_call(match="`TPUBf16PrecisionPlugin` is deprecated"):
        bf16 = xla_plugins.TPUBf16PrecisionPlugin()
    with pytest.deprecated_call(match="`TPUPrecisionPlugin` is deprecated"):
        fp32 = xla_plugins.TPUPrecisionPlugin()
    assert (bf16.precision, fp32.precision) == ("bf16-true", "32-true")
    trainer = build(accelerator=accelerator, strategy=strategy, plugins=[bf16])
    assert trainer.precision_plugin is bf16 and isinstance(trainer.accelerator, xla_plugins.XLAAccelerator)


def test_explain_returns_the_decisions_as_data_and_as_text():
    explanation = trainer_plugins.explain(accelerator="tpu", devices=1, precision="bf16-true")
    rows = explanation.as_dicts()
    assert [row["role"] for row in rows] == [
        "accelerator",
        "devices",
        "environment",
        "strategy",
        "precision",
        "is_distributed",
    ]
    by_role = {row["role"]: row for row in rows}
    assert by_role["accelerator"]["choice"] == "xla (xla_plugins.roles.accelerator.XLAAccelerator)"
    assert by_role["strategy"]["choice"] == "single_xla (xla_plugins.strategies.single_xla.SingleDeviceXLAStrategy)"
    assert by_role["strategy"]["plugin"].startswith("xla (xla-plugins ")
    assert (
        "chosen for 1 device(s)" in by_role["strategy"]["reason"]
        and "pairing accepted by xla" in by_role["strategy"]["reason"]
    )
    assert by_role["precision"]["reason"] == "handles precision='bf16-true'"
    assert by_role["is_distributed"]["choice"] == "False"
    text = str(explanation)
    assert text.splitlines()[0].startswith("accelerator ") and "<- xla (xla-plugins" in text


def test_explain_auto_says_which_accelerators_were_available_and_their_priorities():
    row = trainer_plugins.explain(accelerator="auto", devices=1).as_dicts()[0]
    assert row["choice"] == "cpu (lightning.pytorch.accelerators.cpu.CPUAccelerator)"
    assert row["reason"] == "available, highest auto priority (0); not available: xla (100), mps (20), cuda (10)"

"""Property: any combination of flags gives a consistent set of objects or a clear, expected error."""

from __future__ import annotations

import warnings

import pytest

L = pytest.importorskip("lightning")
from conftest import HAS_TORCH_XLA  # noqa: E402
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from lightning.fabric.accelerators.xla import XLAAccelerator as AnyXLAAccelerator  # noqa: E402
from lightning.pytorch.strategies import SingleDeviceStrategy, SingleDeviceXLAStrategy, XLAStrategy  # noqa: E402
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

EXPECTED_ERRORS = (ValueError, TypeError, MisconfigurationException, NotImplementedError, ModuleNotFoundError)
VALID_HEAVY = 3  # valid values are repeated so that successful builds are explored as often as errors
FLAGS = {
    "accelerator": st.sampled_from(["auto", "cpu", "xla", "tpu"] * VALID_HEAVY + ["gpu", "cuda", "mps", "npu"]),
    "devices": st.one_of(
        st.sampled_from(
            ["auto", 1, "1", [0], "0,"] * VALID_HEAVY + [2, "2", 0, "0,1", "", "x", None, True, [1], [0, 1], []]
        ),
        st.integers(-2, 9),
    ),
    "strategy": st.sampled_from(
        ["auto", "single_xla", "ddp"] * VALID_HEAVY
        + ["ddp_spawn", "xla", "single_tpu", "single_device", "fsdp", "deepspeed", "nope"]
    ),
    "precision": st.sampled_from(
        [None, "32-true", "16-true", "bf16-true"] * VALID_HEAVY
        + ["16-mixed", "bf16-mixed", "64-true", 16, 32, "bf16", "8-true"]
    ),
    "num_nodes": st.sampled_from([1] * VALID_HEAVY + [2, 0, -1]),
}


def _squash(text: str) -> str:
    return text.lower().replace("_", "").replace("-", "").replace(" ", "")


def names_an_offending_flag(message: str, flags: dict) -> bool:
    tokens = (
        set(flags)
        | {name.rstrip("s") for name in flags}
        | {str(value) for value in flags.values() if value not in ("auto", None)}
    )
    return any(_squash(token) in _squash(message) for token in tokens if _squash(token))


def check_consistent(trainer: L.Trainer, flags: dict) -> None:
    connector = trainer._accelerator_connector
    accelerator, strategy = trainer.accelerator, trainer.strategy
    assert isinstance(connector.is_distributed, bool)
    if isinstance(accelerator, AnyXLAAccelerator):
        assert isinstance(strategy, (SingleDeviceXLAStrategy, XLAStrategy))
        assert type(trainer.precision_plugin).__module__ == "xla_plugins.precision"
        assert trainer.precision_plugin.precision in ("32-true", "16-true", "bf16-true")
    if isinstance(strategy, SingleDeviceStrategy):
        assert strategy.root_device.type == connector._parallel_devices[0].type
        if isinstance(strategy, SingleDeviceXLAStrategy):
            assert strategy.root_device == connector._parallel_devices[0]
    if isinstance(strategy, XLAStrategy):
        assert len(connector._parallel_devices) > 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**FLAGS)
def test_any_flag_combination_gives_consistent_objects_or_an_expected_error(
    accelerator, devices, strategy, precision, num_nodes
):
    flags = dict(accelerator=accelerator, devices=devices, strategy=strategy, precision=precision, num_nodes=num_nodes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer = L.Trainer(logger=False, **flags)
        except EXPECTED_ERRORS as error:
            if isinstance(error, ModuleNotFoundError):  # a missing backend: the message names the module
                missing = "deepspeed" if "deepspeed" in str(error) else "torch_xla"
                assert missing in str(error) and (missing == "deepspeed" or not HAS_TORCH_XLA), error
            else:
                assert names_an_offending_flag(str(error), flags), f"{type(error).__name__}: {error} (flags {flags})"
            event(f"rejected with {type(error).__name__}")
            return
    check_consistent(trainer, flags)
    event(f"built {type(trainer.accelerator).__name__} + {type(trainer.strategy).__name__}")

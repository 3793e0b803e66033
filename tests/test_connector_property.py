"""Property: any combination of flags gives a consistent set of objects or a clear, expected error."""

from __future__ import annotations

import re
import warnings

import pytest

L = pytest.importorskip("lightning")
from conftest import HAS_TORCH_XLA  # noqa: E402
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from lightning.fabric.accelerators.xla import XLAAccelerator as AnyXLAAccelerator  # noqa: E402
from lightning.pytorch.strategies import SingleDeviceStrategy, SingleDeviceXLAStrategy, XLAStrategy  # noqa: E402
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

import trainer_plugins  # noqa: E402

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


#: The value of each flag when the user does not pass it.
DEFAULTS = {"accelerator": "auto", "devices": "auto", "strategy": "auto", "precision": None, "num_nodes": 1}
#: Lightning's own messages that name the flag but not its value (trainer-plugins passes them on unchanged).
LIGHTNING_MESSAGES_WITHOUT_THE_VALUE = {
    "devices": ("`devices` selected with `CPUAccelerator` should be an int > 0.",),  # CPUAccelerator.parse_devices
}


def build(flags: dict) -> BaseException | None:
    """The error ``L.Trainer(**flags)`` raises, or ``None`` when it builds."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            L.Trainer(logger=False, **flags)
        except EXPECTED_ERRORS as error:
            return error
    return None


def _outcome(error: BaseException | None) -> tuple[str, str] | None:
    """An error as type and message, without object addresses (they differ from run to run)."""
    return None if error is None else (type(error).__name__, re.sub(r" at 0x[0-9a-f]+", "", str(error)))


def offending_flags(flags: dict, error: BaseException) -> list[str]:
    """The flags the error is about: given a value of their own, and without it the error is gone or another one."""
    return [
        name
        for name, value in flags.items()
        if value != DEFAULTS[name] and _outcome(build({**flags, name: DEFAULTS[name]})) != _outcome(error)
    ]


def written_forms(name: str, value) -> set[str]:
    """How a message may write a flag's value: as given, as Lightning parses it, or as the class a name selects."""
    forms = {str(value), repr(value)}
    if (
        name == "devices"
        and isinstance(value, str)
        and re.fullmatch(r"[\d,\s]*", value)
        and ("," in value or not value)
    ):
        forms.add(repr([int(part) for part in value.split(",") if part.strip()]))  # Lightning's parsing of '0,1'
    if name in ("accelerator", "strategy") and isinstance(value, str):
        claim = trainer_plugins.get_catalog().claims.get(name, {}).get(value.lower())
        path = claim.entry.class_path("trainer") if claim is not None else None
        if path is not None:
            forms.add(path.rpartition(":")[2])  # 'cpu' -> CPUAccelerator, 'single_tpu' -> SingleDeviceXLAStrategy
    return {form for form in forms if form}


def names_an_offending_value(message: str, flags: dict, offending: list[str]) -> bool:
    """Whether ``message`` writes the value of one of the ``offending`` flags (a whole word, any case)."""
    for name in offending:
        if message in LIGHTNING_MESSAGES_WITHOUT_THE_VALUE.get(name, ()):
            return True
        for form in written_forms(name, flags[name]):
            if re.search(rf"(?<![\w-]){re.escape(form)}(?![\w-])", message, re.IGNORECASE):
                return True
    return False


def check_consistent(trainer: L.Trainer, flags: dict) -> None:
    connector = trainer._accelerator_connector
    accelerator, strategy = trainer.accelerator, trainer.strategy
    assert isinstance(connector.is_distributed, bool)
    if isinstance(accelerator, AnyXLAAccelerator):
        assert isinstance(strategy, (SingleDeviceXLAStrategy, XLAStrategy))
        assert type(trainer.precision_plugin).__module__ == "xla_plugins.roles.precision"
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
                offending = offending_flags(flags, error)
                assert offending, f"{type(error).__name__}: {error} (flags {flags}): no single flag causes it"
                assert names_an_offending_value(str(error), flags, offending), (
                    f"{type(error).__name__}: {error} (flags {flags}) names the value of none of {offending}"
                )
            event(f"rejected with {type(error).__name__}")
            return
    check_consistent(trainer, flags)
    event(f"built {type(trainer.accelerator).__name__} + {type(trainer.strategy).__name__}")

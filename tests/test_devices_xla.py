"""`devices=` for XLA with N real PJRT CPU devices, N = 4 (a TPU v4 host) and N = 8 (v2/v3 hosts).

The count is real: each case runs in a fresh interpreter with CPU_NUM_DEVICES=N, and the plugin
asks the PJRT runtime. Nothing is faked.
"""

from __future__ import annotations

import json
from importlib.metadata import version

import pytest
from conftest import run_python
from packaging.version import Version

pytestmark = pytest.mark.xla


TABLE_SCRIPT = """
import json, warnings
import lightning as L

N = {n}
CASES = ["auto", 1, [0], [N - 1], N, str(N), f"{{N - 1}},", 0, "0", [], None, True]
CASES += [2, 3, -1, N + 1, [0, 1], "0,1,2", [N], "abc"]
rows = []
for devices in CASES:
    try:
        trainer = L.Trainer(accelerator="xla", devices=devices, logger=False)
    except Exception as error:
        rows.append([repr(devices), type(error).__name__, str(error)])
        continue
    connector = trainer._accelerator_connector
    parsed = [str(d) for d in connector._parallel_devices]
    rows.append([repr(devices), "ok", parsed, str(trainer.strategy.root_device) if len(parsed) == 1 else None])
print(json.dumps(rows))
"""


def table(n: int) -> dict[str, list]:
    result = run_python(TABLE_SCRIPT.format(n=n), env={"CPU_NUM_DEVICES": str(n), "PJRT_DEVICE": "CPU"})
    return {row[0]: row[1:] for row in json.loads(result.stdout.splitlines()[-1])}


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.parametrize("n", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_devices_table(n):
    rows = table(n)
    every = [f"xla:{i}" for i in range(n)]
    choices = f"`devices` can only be 'auto', 1, {n} or [0-{n - 1}] for XLA, got"
    source = (
        f"The PJRT runtime reports {n} CPU device(s) (PJRT_DEVICE=CPU); set CPU_NUM_DEVICES=<n> for n devices,"
        " or PJRT_DEVICE for another device type."
    )

    # accepted values
    assert rows["'auto'"] == ["ok", every, None]
    assert rows[repr(n)] == rows[repr(str(n))] == ["ok", every, None]
    assert rows["1"] == rows["[0]"] == ["ok", ["xla:0"], "xla:0"]
    assert rows[repr([n - 1])] == rows[repr(f"{n - 1},")] == ["ok", [f"xla:{n - 1}"], f"xla:{n - 1}"]

    # zero devices: Lightning's own check
    for zero in ("0", "'0'", "[]"):
        assert rows[zero][0] == "MisconfigurationException" and f"devices={zero}" in rows[zero][1]

    # not a count at all
    for wrong_type in ("None", "True"):
        assert rows[wrong_type] == [
            "TypeError",
            f"`devices` for XLA must be 'auto', an int, a string or a list of ints, got {wrong_type}.",
        ]

    # any other count, several indices, an index out of range
    for value in ("2", "3", "-1", repr(n + 1), "[0, 1]", "'0,1,2'", repr([n])):
        if value == repr(n):
            continue
        kind, message = rows[value]
        assert kind == "ValueError", value
        assert message.startswith(choices) and message.endswith(source), message
    assert rows["'0,1,2'"][1] == f"{choices} [0, 1, 2]. {source}"

    # an unparsable string is quoted
    assert rows["'abc'"] == ["ValueError", f"{choices} 'abc'. {source}"]


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_with_one_device_each_choice_is_listed_once_with_the_source_of_the_count():
    result = run_python(
        """
        import xla_plugins
        try:
            xla_plugins.XLAAccelerator.parse_devices(3)
        except ValueError as error:
            print(error)
        """,
        env={"CPU_NUM_DEVICES": "1", "PJRT_DEVICE": "CPU"},
    )
    assert result.stdout.splitlines()[-1] == (
        "`devices` can only be 'auto', 1 or [0] for XLA, got 3. The PJRT runtime reports 1 CPU device(s)"
        " (PJRT_DEVICE=CPU); set CPU_NUM_DEVICES=<n> for n devices, or PJRT_DEVICE for another device type."
    )


def _runtime_reason(pjrt_device: str) -> str:
    """The PJRT runtime's own reason for refusing ``pjrt_device``, as torch_xla words it."""
    if pjrt_device == "TPU":
        return "OSError: libtpu not found"
    # an unknown device type: the wording changed between torch_xla releases
    if Version(version("torch_xla")) < Version("2.9"):
        return (
            "RuntimeError: torch_xla/csrc/runtime/pjrt_registry.cpp:219 : Check failed: client"
            f" Unknown PJRT_DEVICE '{pjrt_device}'"
        )
    return f"RuntimeError: No PjRtPlugin registered for: {pjrt_device}"


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
@pytest.mark.parametrize("pjrt_device", ["TPU", "NPU9000"])
def test_an_unusable_pjrt_device_is_named_with_how_to_choose_another(pjrt_device):
    result = run_python(
        """
        import lightning as L
        try:
            L.Trainer(accelerator="tpu", devices=1)
        except RuntimeError as error:
            print("error:", error)
        """,
        env={"PJRT_DEVICE": pjrt_device},
    )
    message = result.stdout.removeprefix("error: ").strip()
    # one line with the runtime's reason and no C++ stack trace (torch_xla 2.8 appends one)
    assert "\n" not in message and "stack trace" not in message, message
    assert message.startswith(
        f"plugin xla (xla-plugins {version('xla-plugins')}): PJRT_DEVICE={pjrt_device} is not usable here:"
        f" {_runtime_reason(pjrt_device)}"
    )
    assert message.endswith(". Set PJRT_DEVICE to an attached device type (TPU, CUDA, CPU, ...).")
    assert ".. " not in message, message  # the runtime's closing full stop is not doubled


@pytest.mark.parametrize("pjrt_device", ["TPU", "CUDA", "NPU9000", ""])
def test_auto_runs_on_cpu_with_one_warning_naming_pjrt_device_when_it_names_an_absent_device(pjrt_device, monkeypatch):
    import warnings

    import lightning as L

    monkeypatch.setenv("PJRT_DEVICE", pjrt_device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = L.Trainer(logger=False)
    assert type(trainer.accelerator).__name__ == "CPUAccelerator"
    named = [str(w.message) for w in caught if "PJRT_DEVICE" in str(w.message)]
    assert len(named) == 1, named
    assert named[0].startswith(f"PJRT_DEVICE={pjrt_device!r} ")


def test_doctor_reports_an_empty_pjrt_device_as_set_but_empty(monkeypatch):
    from xla_plugins import _doctor

    monkeypatch.setenv("PJRT_DEVICE", "")
    info = _doctor.describe()
    assert info["PJRT_DEVICE"] == "'' (set but empty)"
    assert info["error"].startswith("PJRT_DEVICE is set but empty")
    assert "device type" not in info


def test_doctor_refuses_pjrt_device_cuda_where_torch_xla_has_no_cuda_with_the_fix(monkeypatch):
    from xla_plugins import _doctor

    monkeypatch.setenv("PJRT_DEVICE", "CUDA")
    for installed, refused in [("2.9.0", True), ("2.8.1", False)]:  # 2.8 was the last torch_xla with XLA:CUDA
        monkeypatch.setattr(_doctor, "version", lambda name, v=installed: v if name == "torch_xla" else "2.9.0")
        assert _doctor._cuda_removed() is refused
    monkeypatch.setattr(_doctor, "version", lambda name: "2.9.0")
    info = _doctor.describe()
    assert info["error"].startswith("PJRT_DEVICE=CUDA, but torch_xla 2.9.0 has no CUDA device")
    assert info["error"].endswith("pip install 'xla-plugins[xla28]'")
    assert "device type" not in info  # no runtime was started for a device that cannot exist


class FakeDistribution:
    """Mocked metadata: a torch_tpu or PyPI torchax cannot be installed next to this environment's torch_xla."""

    def __init__(self, version: str, files: list[str]) -> None:
        self.version, self.files = version, files


def test_doctor_names_torch_tpu_and_a_shadowing_torchax_with_their_fixes(monkeypatch):
    from importlib import metadata

    from xla_plugins import _doctor

    assert _doctor.environment_problems() == []  # this environment: torch_xla's own torchax only
    real_distribution, real_version = metadata.distribution, _doctor.version
    fakes = {"torch_tpu": FakeDistribution("0.2.0", []), "torchax": FakeDistribution("0.0.7", ["torchax/__init__.py"])}

    def distribution(name):
        return fakes[name] if name in fakes else real_distribution(name)

    monkeypatch.setattr(metadata, "distribution", distribution)
    monkeypatch.setattr(_doctor, "version", lambda name: fakes[name].version if name in fakes else real_version(name))
    torch_tpu, torchax = _doctor.environment_problems()
    assert torch_tpu.startswith("torch_tpu 0.2.0 is installed: it loads itself on every `import torch`")
    assert torchax.startswith(
        f"torchax 0.0.7 from the package index is installed next to torch_xla {real_version('torch_xla')}"
    )
    assert "pip uninstall torchax, then pip install --force-reinstall --no-deps 'torch_xla==" in torchax
    assert _doctor.describe()["environment problem 1"] == torch_tpu


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_the_single_device_strategy_with_several_devices_is_an_error_naming_both_flags():
    result = run_python(
        """
        import lightning as L
        try:
            L.Trainer(accelerator="tpu", devices=2, strategy="single_xla", logger=False)
        except ValueError as error:
            print("error:", error)
        """,
        env={"CPU_NUM_DEVICES": "2", "PJRT_DEVICE": "CPU"},
    )
    assert result.stdout.strip().splitlines()[-1] == (
        "error: `strategy='single_xla'` drives one device, but `devices=2` selects 2. Pass `devices=1` (or a"
        " one-device list) for it, or a multi-device strategy (`strategy='auto'` picks one)."
    )


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_messages_a_newcomer_reads_name_the_real_choice_and_appear_once():
    """With PJRT_DEVICE unset: the devices error says torch_xla chose the device, `strategy="fsdp"` on XLA
    names xla_fsdp_v2, and `explain` after a fit does not log the start-up line a second time."""
    result = run_python(
        """
        import lightning as L, trainer_plugins
        from lightning.pytorch.demos.boring_classes import BoringModel
        for flags in ({"devices": 64}, {"devices": 1, "strategy": "fsdp"}):
            try:
                L.Trainer(accelerator="tpu", logger=False, **flags)
            except ValueError as error:
                print("error:", error)
        L.Trainer(accelerator="tpu", devices=1, max_steps=1, logger=False, enable_progress_bar=False,
                  enable_model_summary=False, enable_checkpointing=False).fit(BoringModel())
        print(trainer_plugins.explain(accelerator="tpu", devices=1))
        """,
        env={"PJRT_DEVICE": None},
    )
    devices, fsdp = [line for line in result.stdout.splitlines() if line.startswith("error: ")]
    assert "device(s) (PJRT_DEVICE is unset, so torch_xla chose CPU); set CPU_NUM_DEVICES=<n>" in devices
    assert fsdp.startswith("error: The strategy `fsdp` requires a GPU accelerator")
    assert fsdp.endswith(
        "The accelerator 'xla' comes from plugin xla (xla-plugins " + version("xla-plugins") + "), whose Trainer"
        " strategies are 'single_xla', 'xla', 'xla_debug', 'xla_fsdp_v2', 'xla_spmd' (or strategy='auto')."
    )
    startup = [line for line in result.stderr.splitlines() if line.startswith("trainer-plugins: accelerator=")]
    assert len(startup) == 1  # the fit's; explain resolves flags without starting a run
    assert (
        "is_distributed  False  <- trainer-plugins: not one of Lightning's distributed strategy classes"
        in result.stdout
    )

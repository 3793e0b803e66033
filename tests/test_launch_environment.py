"""The pre-start environment role: a plugin's job-wide variables, set where unset, before any worker starts."""

from __future__ import annotations

import os

import pytest

L = pytest.importorskip("lightning")
from fake_accelerators import FakeAccelerator  # noqa: E402
from plugin_helpers import make_plugin  # noqa: E402

import trainer_plugins  # noqa: E402
from trainer_plugins import AcceleratorEntry, PluginError, PluginRecord  # noqa: E402
from trainer_plugins._launch_environment import apply  # noqa: E402

ADDRESSES, PRESET = "TP_TEST_LAUNCH_ADDRESSES", "TP_TEST_LAUNCH_PRESET"
API = ">=1.2,<2"
FAKE = "fake_accelerators:FakeAccelerator"


@pytest.fixture(autouse=True)
def _rank_zero_kept(monkeypatch):
    """Lightning's DDP strategy sets the process-wide ``rank_zero_only.rank`` from the environment's rank (1 for
    the outside launcher's worker below), which would silence every later rank-zero message in this process."""
    from lightning.fabric.utilities import rank_zero as fabric_rank_zero
    from lightning.pytorch.utilities import rank_zero as trainer_rank_zero

    for module in (fabric_rank_zero, trainer_rank_zero):
        monkeypatch.setattr(module.rank_zero_only, "rank", module.rank_zero_only.rank)


@pytest.fixture
def launch_plugin(extra_plugins):
    """A plugin whose accelerator 'prestart_npu' needs two variables; returns the list of the hook's calls."""
    calls = []

    def launch_environment(accelerator, strategy, num_nodes, processes_per_node, started_externally, api):
        if not isinstance(accelerator, FakeAccelerator):
            return None
        calls.append(
            (type(strategy).__name__, num_nodes, processes_per_node, started_externally, api, ADDRESSES in os.environ)
        )
        return {ADDRESSES: ",".join(f"h:{8070 + i}" for i in range(processes_per_node)), PRESET: "from-plugin"}

    plugin = make_plugin(
        api=API,
        accelerators=lambda: [AcceleratorEntry("prestart_npu", trainer=FAKE, fabric=FAKE)],
        launch_environment=launch_environment,
    )
    extra_plugins("prestart", plugin)
    yield calls
    os.environ.pop(ADDRESSES, None)


def test_unset_variables_are_set_before_the_launcher_and_set_ones_kept(launch_plugin, monkeypatch):
    monkeypatch.setenv(PRESET, "from-user")
    trainer = L.Trainer(accelerator="prestart_npu", devices=2, strategy="ddp", logger=False)
    # set when the Trainer is built, before `fit` launches any worker (the workers inherit os.environ)
    assert launch_plugin == [("DDPStrategy", 1, 2, False, "trainer", False)]
    assert os.environ[ADDRESSES] == "h:8070,h:8071"
    assert os.environ[PRESET] == "from-user"
    rows = {row["role"]: row for row in trainer._accelerator_connector.plugin_connector.explanation.as_dicts()}
    assert rows["launch_environment"]["choice"] == f"set {ADDRESSES}; kept as set before {PRESET}"
    assert rows["launch_environment"]["plugin"] == "prestart (test-dist 1.0)"


def test_a_worker_an_outside_launcher_started_is_told_so(launch_plugin, monkeypatch):
    # Lightning's own variables as torchrun-like engines set them: LightningEnvironment creates no process
    for name, value in {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(ADDRESSES, "set-by-the-engine")
    L.Trainer(accelerator="prestart_npu", devices=2, strategy="ddp", num_nodes=1, logger=False)
    assert launch_plugin == [("DDPStrategy", 1, 2, True, "trainer", True)]
    assert os.environ[ADDRESSES] == "set-by-the-engine"


def test_fabric_asks_too_and_explain_applies_nothing(launch_plugin):
    trainer_plugins.explain("trainer", accelerator="prestart_npu", devices=1)
    assert launch_plugin == [] and ADDRESSES not in os.environ
    L.Fabric(accelerator="prestart_npu", devices=1)
    assert launch_plugin == [("SingleDeviceStrategy", 1, 1, False, "fabric", False)]
    assert os.environ[ADDRESSES] == "h:8070"


def test_an_answer_that_is_not_str_to_str_is_the_plugins_error(extra_plugins):
    plugin = make_plugin(
        api=API,
        accelerators=lambda: [AcceleratorEntry("prestart_bad", trainer="fake_accelerators:FakeAccelerator")],
        launch_environment=lambda accelerator, **_: (
            {ADDRESSES: 8070} if isinstance(accelerator, FakeAccelerator) else None
        ),
    )
    extra_plugins("prestart_bad", plugin)
    with pytest.raises(PluginError, match="expected non-empty str names and str values"):
        L.Trainer(accelerator="prestart_bad", devices=1, logger=False)
    assert ADDRESSES not in os.environ


def test_apply_sets_the_first_plugins_value_and_keeps_what_is_set():
    first, second = PluginRecord("first", "tests.first"), PluginRecord("second", "tests.second")
    environ = {"SET": "before", "EMPTY": ""}
    done = apply([(first, {"NEW": "1", "SET": "x", "EMPTY": "y"}), (second, {"NEW": "2", "OTHER": "3"})], environ)
    assert environ == {"SET": "before", "EMPTY": "", "NEW": "1", "OTHER": "3"}
    assert done.set == {"NEW": "1", "OTHER": "3"} and done.plugins == {"NEW": "first", "OTHER": "second"}
    assert done.kept == {"SET": ("before", "x"), "EMPTY": ("", "y")}

"""A quiet Trainer's XLA step does the raw torch_xla loop's device work: the same graph, syncs and transfers.

Counts, not times: benchmarks/step_counts.py runs the raw loop, the quiet Trainer (no progress
bar, logger, checkpointing or summary) and the same Trainer on Lightning's own XLA classes, on the
same model and data in one fresh interpreter, and reports torch_xla's counters and the Python calls
per steady-state step. The closure-result tests run on CPU tensors:
:class:`xla_plugins.loop.closure.ClosureResultOnXLA` is device-independent logic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "step_counts.py"


def step_counts(modes: str, recompiles: str, goodput: str = "off") -> dict:
    environ = {**os.environ, "PJRT_DEVICE": "CPU", "XLA_PLUGINS_RECOMPILES": recompiles, "XLA_PLUGINS_GOODPUT": goodput}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--modes", modes],
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.splitlines()[-1])["per_step"]


@pytest.fixture(scope="module")
def per_step() -> dict:
    """The counts with the compile monitor and the goodput ledger off: the step's own budget (theirs: own tests)."""
    return step_counts("raw,plugin,lightning", "off")


@pytest.fixture(scope="module")
def per_step_monitored() -> dict:
    """The counts with the compile monitor on (its default, ``XLA_PLUGINS_RECOMPILES=warn``)."""
    return step_counts("plugin", "warn")


@pytest.fixture(scope="module")
def per_step_with_ledger() -> dict:
    """The counts with the goodput ledger on (its default, ``XLA_PLUGINS_GOODPUT=on``), the monitor off."""
    return step_counts("plugin", "off", goodput="on")


@pytest.fixture(scope="module")
def per_step_with_both() -> dict:
    """The counts with the compile monitor and the goodput ledger on: the defaults."""
    return step_counts("plugin", "warn", goodput="on")


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_the_quiet_trainers_step_graph_is_the_raw_loops(per_step):
    raw, plugin = per_step["raw"], per_step["plugin"]
    assert raw["steps_counted"] == plugin["steps_counted"] == 64
    # one sync, one graph executed, no compilation in steady state, as the raw loop
    for counts in (raw, plugin):
        assert counts["syncs"] == counts["graphs_executed"] == 1, counts
        assert counts.get("compilations", 0) == 0, counts
    # the same graph: Lightning's division of the loss by accumulate_grad_batches=1 (a division and
    # its constant in the forward and the backward pass) is no longer traced
    assert plugin["graph_nodes"] == raw["graph_nodes"], (raw, plugin)
    assert "div" not in plugin["ops"], plugin["ops"]
    # the batch's two tensors go to the device, nothing comes back
    assert plugin["transfers_to_device"] == raw["transfers_to_device"] == 2
    assert plugin.get("transfers_from_device", 0) == raw.get("transfers_from_device", 0) == 0
    # what remains beyond the raw loop: Lightning's detached clone of the loss (one graph output more)
    assert plugin["device_data_handles"] == raw["device_data_handles"] + 1, (raw, plugin)


def test_a_loss_tensor_is_cloned_not_divided_when_nothing_accumulates():
    import torch

    from xla_plugins.loop.closure import ClosureResultOnXLA

    weight = torch.tensor(3.0, requires_grad=True)
    loss = weight * 2
    result = ClosureResultOnXLA.from_training_step_output(loss, 1)
    # a new tensor, as Lightning's division makes, with the same value and gradient
    assert result.closure_loss is not loss and result.closure_loss.grad_fn.name() == "CloneBackward0"
    assert result.closure_loss.item() == 6.0 and result.loss.item() == 6.0 and not result.loss.requires_grad
    result.closure_loss.backward()
    assert weight.grad.item() == 2.0

    extra = torch.tensor(1.0)
    result = ClosureResultOnXLA.from_training_step_output({"loss": loss, "extra": extra}, 1)
    assert result.closure_loss.grad_fn.name() == "CloneBackward0" and result.extra == {"extra": extra}
    assert result.asdict()["loss"].item() == 6.0


def test_lightnings_division_and_errors_stay_for_everything_else():
    import torch
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from xla_plugins.loop.closure import ClosureResultOnXLA

    loss = torch.tensor(3.0, requires_grad=True) * 2
    result = ClosureResultOnXLA.from_training_step_output(loss, 2)  # accumulate_grad_batches=2
    assert result.closure_loss.grad_fn.name() == "DivBackward0" and result.closure_loss.item() == 3.0
    assert ClosureResultOnXLA.from_training_step_output(None, 1).closure_loss is None
    with pytest.raises(MisconfigurationException, match="'loss' key needs to be present"):
        ClosureResultOnXLA.from_training_step_output({"other": loss}, 1)
    with pytest.raises(MisconfigurationException, match="must return a Tensor, a dict, or None"):
        ClosureResultOnXLA.from_training_step_output(1.0, 1)


def test_the_xla_accelerator_installs_the_result_class_on_its_trainer_only():
    import lightning as L
    from lightning.pytorch.loops.optimization.automatic import ClosureResult

    from xla_plugins.loop.closure import ClosureResultOnXLA

    flags = dict(devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    xla_trainer, cpu_trainer = L.Trainer(accelerator="xla", **flags), L.Trainer(accelerator="cpu", **flags)
    xla_trainer.accelerator.setup(xla_trainer)
    assert xla_trainer.fit_loop.epoch_loop.automatic_optimization.output_result_cls is ClosureResultOnXLA
    assert cpu_trainer.fit_loop.epoch_loop.automatic_optimization.output_result_cls is ClosureResult


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_the_plugin_adds_a_handful_of_python_calls_a_step_to_lightnings_own_xla_loop(per_step):
    plugin, lightning = per_step["plugin"], per_step["lightning"]
    # Lightning's own XLA classes trace the division of the loss by one (4 graph nodes) ...
    assert lightning["graph_nodes"] == plugin["graph_nodes"] + 4, (lightning, plugin)
    # ... and the plugin's Python per step is its precision plugin's forward context (one reused dtype
    # context: enter, exit), input conversion and optimizer step, the lazy metrics' check, the closure
    # result, the strategy's batch-start hooks (the stop check, the batch's device seed) and the
    # resumable loader's next(): 11 calls on Lightning 2.6 (measured 11.2 with the loader's start of
    # each epoch), 11 more than Lightning's own XLA loop in all. A callback of ours costs Lightning's
    # hook dispatch on six hooks a step (the checkpoint record's callback did: 94 more).
    assert plugin["python_calls_by_owner"]["xla_plugins"] <= 12, plugin["python_calls_by_owner"]
    assert plugin["python_calls"] - lightning["python_calls"] <= 20, (plugin["python_calls"], lightning["python_calls"])


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_the_compile_monitor_adds_no_device_work_and_two_python_calls_per_hook_call(per_step, per_step_monitored):
    unwatched, watched = per_step["plugin"], per_step_monitored["plugin"]
    # the same graph, syncs, compilations and transfers: the monitor reads counters, never the device
    for name in ("graph_nodes", "syncs", "graphs_executed", "transfers_to_device", "device_data_handles"):
        assert watched[name] == unwatched[name], name
    assert watched.get("compilations", 0) == 0 and watched.get("transfers_from_device", 0) == 0, watched
    # Lightning profiles about 32 hook calls a step on this loop; the core's wrapper calls the monitor
    # at the start and stop of the 11 that run code (one Python call each, which reads one torch_xla
    # counter), not at those of hooks that do nothing (runs_empty_hook: 15 here) nor of its own callback
    # hooks: 22.1 counter reads a step (48.1 when it heard every action), no metric read
    assert watched["counter_reads"] <= 24, watched["counter_reads"]
    assert watched["metric_reads"] == unwatched["metric_reads"] == 0, watched
    added = watched["python_calls_by_owner"]["xla_plugins"] - unwatched["python_calls_by_owner"]["xla_plugins"]
    assert added <= 30, watched["python_calls_by_owner"]
    # the wrapper's start and stop at each boundary (60 a step) in place of Lightning's PassThroughProfiler's,
    # and Lightning's dispatch of the monitor's own callback hooks
    assert watched["python_calls_by_owner"]["trainer_plugins"] <= 65, watched["python_calls_by_owner"]
    assert watched["python_calls"] - unwatched["python_calls"] <= 115, (
        watched["python_calls"],
        unwatched["python_calls"],
    )


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_the_goodput_ledger_adds_no_device_work_and_a_python_call_per_hook_boundary(per_step, per_step_with_ledger):
    unwatched, watched = per_step["plugin"], per_step_with_ledger["plugin"]
    for name in ("graph_nodes", "syncs", "graphs_executed", "transfers_to_device", "device_data_handles"):
        assert watched[name] == unwatched[name], name
    assert watched.get("compilations", 0) == 0 and watched.get("transfers_from_device", 0) == 0, watched
    # the ledger hears each of Lightning's profiler boundaries (about 64 a step here) with one Python call
    # in place of the PassThroughProfiler's own; the few it acts on (the batch's fetch and move to the
    # device, the step's end) charge its clock, read torch_xla's compile counter (CompileSeconds, in
    # xla_plugins) and write the run directory's stamp (none here: the quiet Trainer writes nothing)
    by_owner, before = watched["python_calls_by_owner"], unwatched["python_calls_by_owner"]
    assert by_owner["trainer_plugins"] - before.get("trainer_plugins", 0) <= 85, by_owner
    assert by_owner["xla_plugins"] - before["xla_plugins"] <= 6, by_owner
    assert watched["python_calls"] - unwatched["python_calls"] <= 50, (
        watched["python_calls"],
        unwatched["python_calls"],
    )


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_with_the_compile_monitor_the_ledger_shares_its_wrapper_and_costs_one_call_a_boundary(
    per_step_monitored, per_step_with_both
):
    monitored, both = per_step_monitored["plugin"], per_step_with_both["plugin"]
    for name in ("graph_nodes", "syncs", "graphs_executed", "transfers_to_device", "device_data_handles"):
        assert both[name] == monitored[name], name
    # the one wrapper calls each listener only at the actions it hears (worked out once a name): the
    # ledger adds its handlers at its six boundaries and their compile-counter reads (5 a step)
    assert both["python_calls_by_owner"]["xla_plugins"] - monitored["python_calls_by_owner"]["xla_plugins"] <= 6
    assert both["python_calls_by_owner"]["trainer_plugins"] <= 100, both["python_calls_by_owner"]
    assert both["counter_reads"] - monitored["counter_reads"] <= 5, (both["counter_reads"], monitored["counter_reads"])
    # both listeners: 155.6 Python calls a step more than with both off (193.7 before the wrapper's routing),
    # 27.1 counter reads (53.1 before)
    assert both["counter_reads"] <= 29, both["counter_reads"]
    assert both["python_calls"] - monitored["python_calls"] <= 60, (both["python_calls"], monitored["python_calls"])

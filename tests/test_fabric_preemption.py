"""Fabric on a stop signal (issue 35 item 6): the write in flight completes; a loop may save at the signal and resume.

Real SIGTERMs (``os.kill``) to this process, on ``single_xla`` with one PJRT CPU device: Lightning's
Fabric installs no handler, so without the plugin's the signal would end the test process. Writes are
held by events the test controls. The spawn strategy (``"xla"``, two replicas) in a subprocess,
tests/scripts/fabric_stop.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from test_fabric_background_saves import held_fabric, releasing_wait, train_one_step  # noqa: E402
from torch import nn  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "fabric_stop.py"
STEPS = 8
SIGNAL_AFTER = 3  # the loop is told to stop after this step's update


@pytest.fixture(autouse=True)
def handlers_put_back():
    """Every Fabric of a test is torn down (its handlers put back): SIGTERM's handler is Python's default after it.

    Each test starts from the default: a Fabric of another test file in this process, never torn down
    (as a Fabric script never is), may have left its handler, which a new Fabric replaces.
    """
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    signal.signal(signal.SIGTERM, before)


def new_fabric():
    fabric = L.Fabric(accelerator="xla", devices=1)
    fabric.launch()
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    module, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    return fabric, module, optimizer


def train(fabric, module, optimizer, path, start: int = 0, signal_after: int | None = None) -> None:
    """The loop of the guide: read the flag before each step; at a stop, save and exit."""
    for step in range(start, STEPS):
        if fabric.strategy.received_sigterm:
            fabric.save(path, {"model": module, "optimizer": optimizer, "step": step})
            fabric.strategy.exit_after_stop()
        batch = torch.randn(8, 4, generator=torch.Generator().manual_seed(step)).to(fabric.device)
        fabric.backward(module(batch).square().mean())
        optimizer.step()
        optimizer.zero_grad()
        if step == signal_after:
            os.kill(os.getpid(), signal.SIGTERM)


def weights(module) -> list[torch.Tensor]:
    return [p.detach().cpu().clone() for p in module.parameters()]


def stop_at_the_signal(fabric, module, optimizer, path, *others) -> None:
    """Train until the signal after step SIGNAL_AFTER; the loop saves and exits 143. Tears down ``others`` too."""
    try:
        with pytest.raises(SystemExit) as stopped:
            train(fabric, module, optimizer, path, signal_after=SIGNAL_AFTER)
    finally:
        for each in (fabric, *others):
            each.strategy.teardown()
    assert stopped.value.code == 143
    assert torch.load(path, weights_only=False)["step"] == SIGNAL_AFTER + 1  # the step after the signal did not run


def test_a_loop_reading_received_sigterm_saves_at_the_signal_exits_143_and_resumes_exactly(tmp_path):
    path = tmp_path / "stop.ckpt"
    stop_at_the_signal(*new_fabric(), path)

    resumed_fabric, module, optimizer = new_fabric()  # the rerun of the script
    try:
        state = {"model": module, "optimizer": optimizer, "step": 0}
        resumed_fabric.load(path, state)
        train(resumed_fabric, module, optimizer, path, start=state["step"])
        resumed = weights(module)
    finally:
        resumed_fabric.strategy.teardown()
    fabric, module, optimizer = new_fabric()  # uninterrupted, for reference
    try:
        train(fabric, module, optimizer, tmp_path / "unused.ckpt")
    finally:
        fabric.strategy.teardown()
    assert all(torch.equal(a, b) for a, b in zip(resumed, weights(module), strict=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stop.ckpt"]


def test_a_fabric_left_set_up_by_an_earlier_script_in_the_process_does_not_take_the_signal(tmp_path):
    # A Fabric script never tears its strategy down: the next Fabric of the process (a notebook's next
    # cell, the next test) replaces the earlier one's handler instead of deferring to it.
    earlier, *_ = new_fabric()
    stop_at_the_signal(*new_fabric(), tmp_path / "stop.ckpt", earlier)


def test_a_loop_that_never_reads_the_flag_ends_at_the_signal_once_the_write_in_flight_is_complete(tmp_path):
    gate, writes, io, fabric, module, optimizer = held_fabric(held=1)
    path = tmp_path / "fabric.ckpt"
    try:
        fabric.save(path, {"model": module, "step": 0})
        io.wait()
        train_one_step(fabric, module, optimizer)
        fabric.save(path, {"model": module, "step": 1})
        assert writes.reached.wait(timeout=120)
        io.wait = releasing_wait(io, writes, gate, "stop waits")  # a stop that did not wait ends before the write
        with pytest.raises(SystemExit) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
            train_one_step(fabric, module, optimizer)  # the loop goes on; the handler ends it
            train_one_step(fabric, module, optimizer)
        events_at_exit, written_at_exit = list(writes.events), sorted(p.name for p in tmp_path.iterdir())
    finally:
        gate.set()
        fabric.strategy.teardown()
    assert stopped.value.code == 143
    assert events_at_exit == ["start", "end", "start", "held mid-write", "stop waits", "end"]
    assert written_at_exit == ["fabric.ckpt"]
    assert torch.load(path, weights_only=False)["step"] == 1


def test_a_handler_the_script_installed_before_launch_still_runs_and_decides():
    called = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: called.append(signum))
    try:
        fabric, module, optimizer = new_fabric()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            train_one_step(fabric, module, optimizer)  # not ended: the script's handler decides
            assert fabric.strategy.received_sigterm is False  # the loop had not read the flag when it came
        finally:
            fabric.strategy.teardown()
    finally:
        signal.signal(signal.SIGTERM, before)
    assert called == [signal.SIGTERM]


def test_exit_after_stop_without_a_signal_names_the_flag(tmp_path):
    fabric, _, _ = new_fabric()
    try:
        assert fabric.strategy.received_sigterm is False
        with pytest.raises(RuntimeError, match="received_sigterm` is True"):
            fabric.strategy.exit_after_stop()
    finally:
        fabric.strategy.teardown()


def test_a_bad_signal_setting_fails_at_launch_naming_the_choices(monkeypatch):
    monkeypatch.setenv("XLA_PLUGINS_CHECKPOINT_SIGNALS", "SIGBOGUS")
    fabric = L.Fabric(accelerator="xla", devices=1)
    with pytest.raises(ValueError, match="SIGBOGUS.*SIGUSR1"):
        fabric.launch()


@pytest.mark.slow  # two replicas in a subprocess: primary tox cell only (tox.ini)
def test_spawn_replicas_stop_at_the_same_read_save_and_the_main_process_exits_143(tmp_path):
    from xla_cpu_harness import required_environment  # imports torch_xla: only once the test runs

    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--signal-after", str(SIGNAL_AFTER)],
        env={**os.environ, **required_environment(2), "XLA_PLUGINS_REPLICA_TIMEOUT": "300"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 143, result.stdout[-3000:] + result.stderr[-6000:]
    assert "END-OF-LOOP" not in result.stdout
    stops = [json.loads((tmp_path / f"rank{rank}.json").read_text())["step"] for rank in range(2)]
    assert stops[0] == stops[1] > SIGNAL_AFTER  # the replicas agreed on one read of the flag
    assert torch.load(tmp_path / "stop.ckpt", weights_only=False)["step"] == stops[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json", "rank1.json", "stop.ckpt"]

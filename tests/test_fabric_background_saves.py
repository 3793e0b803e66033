"""`fabric.save` on the XLA strategies: atomic, in the background; `fabric.load` and the program's end wait.

Real torch_xla on PJRT CPU, one device, in this process (the program's end in a subprocess). Writes
are held by events the test controls, never by sleeping. The multi-device strategies' Fabric saves
are in tests/test_sharded_background_checkpoints.py (``xla_fsdp_v2``, both formats) and
tests/test_spawn_background_checkpoints.py (``xla``).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import threading

import pytest

pytestmark = pytest.mark.xla

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from torch import nn  # noqa: E402

from xla_plugins.checkpoints.checkpoint_io import AtomicXLACheckpointIO, BackgroundXLACheckpointIO  # noqa: E402


@pytest.mark.parametrize(
    "strategy",
    [
        "single_xla.FabricSingleDeviceXLAStrategy",
        "xla.FabricXLAStrategy",
        "xla_spmd.FabricXLASPMDStrategy",
        "xla_fsdp_v2.FabricXLAFSDPv2Strategy",
    ],
)
def test_every_xla_fabric_strategy_writes_atomically_in_the_background_by_default(strategy):
    module, name = strategy.split(".")
    io = getattr(importlib.import_module(f"xla_plugins.strategies.{module}"), name)().checkpoint_io
    assert type(io) is BackgroundXLACheckpointIO
    assert type(io.checkpoint_io) is AtomicXLACheckpointIO


class HeldMidWrite(AtomicXLACheckpointIO):
    """Atomic writes that stop after half of the bytes of write number ``held`` until ``gate`` is set."""

    def __init__(self, held: int, gate: threading.Event) -> None:
        super().__init__()
        self.held, self.gate = held, gate
        self.events: list[str] = []
        self.reached = threading.Event()  # set when the held write stops halfway

    def _write_to(self, checkpoint, stream) -> None:
        import io

        number = self.events.count("start")
        self.events.append("start")
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getvalue()
        stream.write(data[: len(data) // 2])
        stream.flush()
        if number == self.held:
            self.events.append("held mid-write")
            self.reached.set()
            assert self.gate.wait(timeout=120), "the test never released the write"
        stream.write(data[len(data) // 2 :])
        self.events.append("end")


def fabric_with(io: BackgroundXLACheckpointIO):
    fabric = L.Fabric(accelerator="xla", devices=1)
    fabric.strategy._checkpoint_io = io  # Lightning's single-device XLA strategy accepts XLACheckpointIO plugins only
    fabric.launch()
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    module, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return fabric, module, optimizer


def held_fabric(held: int):
    """A Fabric on one device whose write number ``held`` stops halfway until the returned gate is set."""
    gate = threading.Event()
    writes = HeldMidWrite(held=held, gate=gate)
    io = BackgroundXLACheckpointIO(writes)
    return (gate, writes, io, *fabric_with(io))


def releasing_wait(io: BackgroundXLACheckpointIO, writes: HeldMidWrite, gate: threading.Event, event: str):
    """``io.wait`` that notes ``event`` and only then releases the held write: a caller that did not wait goes on
    before the write's end."""
    wait = io.wait

    def wait_releasing() -> None:
        writes.events.append(event)
        gate.set()
        wait()

    return wait_releasing


def train_one_step(fabric, module, optimizer) -> None:
    fabric.backward(module(torch.randn(8, 4, device=fabric.device)).square().mean())
    optimizer.step()
    optimizer.zero_grad()


def test_fabric_save_returns_during_its_write_and_the_previous_file_stays_whole_until_the_rename(tmp_path):
    gate = threading.Event()
    writes = HeldMidWrite(held=1, gate=gate)
    io = BackgroundXLACheckpointIO(writes)
    fabric, module, optimizer = fabric_with(io)
    path = tmp_path / "fabric.ckpt"
    try:
        fabric.save(path, {"model": module, "optimizer": optimizer, "step": 0})
        io.wait()
        train_one_step(fabric, module, optimizer)
        fabric.save(path, {"model": module, "optimizer": optimizer, "step": 1})
        assert writes.reached.wait(timeout=120)
        # fabric.save returned while its write is halfway: the file still holds the previous checkpoint
        assert writes.events == ["start", "end", "start", "held mid-write"]
        assert torch.load(path, weights_only=False)["step"] == 0
        temporaries = [p.name for p in tmp_path.iterdir() if p.name != "fabric.ckpt"]
        assert len(temporaries) == 1 and temporaries[0].startswith(".fabric.ckpt.tmp-")
    finally:
        gate.set()
    io.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fabric.ckpt"]
    assert torch.load(path, weights_only=False)["step"] == 1


def test_fabric_load_waits_for_the_write_in_flight(tmp_path):
    gate, writes, io, fabric, module, optimizer = held_fabric(held=0)
    path = tmp_path / "fabric.ckpt"
    fabric.save(path, {"model": module, "optimizer": optimizer, "step": 3})
    saved = [p.detach().cpu().clone() for p in module.parameters()]
    io.wait = releasing_wait(io, writes, gate, "load waits")  # so a load that did not wait would read before the end
    try:
        assert writes.reached.wait(timeout=120)
        train_one_step(fabric, module, optimizer)  # training goes on while the write is held
        state = {"model": module, "optimizer": optimizer, "step": 0}
        fabric.load(path, state)
    finally:
        gate.set()
    writes.events.append("loaded")
    firsts = [event for i, event in enumerate(writes.events) if event not in writes.events[:i]]
    assert firsts == ["start", "held mid-write", "load waits", "end", "loaded"]  # (the load may wait more than once)
    assert state["step"] == 3
    assert all(torch.equal(p.detach().cpu(), s) for p, s in zip(module.parameters(), saved, strict=True))


_ENDS_DURING_A_WRITE = """
import sys, torch, lightning as L
from xla_plugins.checkpoints.checkpoint_io import AtomicXLACheckpointIO, BackgroundXLACheckpointIO


class WaitsForTheTest(AtomicXLACheckpointIO):
    def write(self, checkpoint, path):
        if sys.argv[2] == "fails":
            raise OSError(f"disk full writing {path}")
        assert sys.stdin.readline().strip() == "go"  # the test sends it once the script's last line ran
        super().write(checkpoint, path)


fabric = L.Fabric(accelerator="xla", devices=1)
fabric.strategy._checkpoint_io = BackgroundXLACheckpointIO(WaitsForTheTest())
fabric.launch()
model = fabric.setup_module(torch.nn.Linear(4, 2))
fabric.save(sys.argv[1], {"model": model, "step": 7})
print("END-OF-SCRIPT", flush=True)
"""


def run_to_the_end(path, mode: str) -> subprocess.CompletedProcess:
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_ENDS_DURING_A_WRITE), str(path), mode],
        env={**os.environ, "PJRT_DEVICE": "CPU"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdin is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.strip() == "END-OF-SCRIPT":
            break
    assert not path.exists()  # the script's last line ran with the write still held
    process.stdin.write("go\n")
    process.stdin.flush()
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, "".join(lines) + out, err)


@pytest.mark.slow  # a subprocess with its own XLA runtime: primary tox cell only (tox.ini)
def test_a_script_that_ends_during_a_background_write_ends_with_the_checkpoint_written(tmp_path):
    result = run_to_the_end(tmp_path / "end.ckpt", "waits")
    assert result.returncode == 0, result.stderr[-3000:]
    assert torch.load(tmp_path / "end.ckpt", weights_only=False)["step"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["end.ckpt"]


@pytest.mark.slow  # a subprocess with its own XLA runtime: primary tox cell only (tox.ini)
def test_a_last_write_that_fails_at_the_end_of_a_script_is_reported(tmp_path):
    result = run_to_the_end(tmp_path / "end.ckpt", "fails")
    assert "A checkpoint written in the background failed: OSError('disk full writing" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []

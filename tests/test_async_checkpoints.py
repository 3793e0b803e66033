"""Checkpoints that do not stall training (issue 24 item 4): background writes, atomic files, commit markers.

Real torch_xla on PJRT CPU, one device, in this process (the SIGKILL case in a subprocess). Slow
writes are made slow by events the test controls, never by sleeping; the tests count what happened
while a write was held.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

pytestmark = pytest.mark.xla

L = pytest.importorskip("lightning")
import fsspec  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from linear_regression import Regression, data  # noqa: E402

from xla_plugins.checkpoints.checkpoint_io import (  # noqa: E402
    WRITES_VARIABLE,
    AtomicXLACheckpointIO,
    BackgroundXLACheckpointIO,
    default_checkpoint_io,
    is_committed,
)


def trainer(**flags) -> L.Trainer:
    defaults = dict(
        accelerator="xla",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    return L.Trainer(**{**defaults, **flags})


class HeldWrites(AtomicXLACheckpointIO):
    """Atomic writes that record their start and end; the write number ``i`` waits for ``gates[i]`` if there is one.

    ``submitted`` holds the names of the saves handed to the writer, recorded on the training thread
    (:class:`RecordsSaves`), so a write counts as pending from its hand-off, before the writer starts it.
    """

    def __init__(self, gates: dict[int, threading.Event]) -> None:
        super().__init__()
        self.gates = gates
        self.events: list[tuple[str, str]] = []
        self.submitted: list[str] = []

    def write(self, checkpoint, path) -> None:
        number = sum(1 for kind, _ in self.events if kind == "start")
        self.events.append(("start", os.path.basename(path)))
        gate = self.gates.get(number)
        if gate is not None:
            assert gate.wait(timeout=120), "the test never released the write"
        super().write(checkpoint, path)
        self.events.append(("end", os.path.basename(path)))

    def pending(self) -> bool:
        return len(self.submitted) > sum(kind == "end" for kind, _ in self.events)


class RecordsSaves(BackgroundXLACheckpointIO):
    """The background writer, recording each save's name in its :class:`HeldWrites` on the training thread."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        self.checkpoint_io.submitted.append(os.path.basename(path))
        super().save_checkpoint(checkpoint, path, storage_options)


@pytest.mark.parametrize(
    "strategy",
    [
        "single_xla.SingleDeviceXLAStrategy",
        "xla.XLAStrategy",
        "xla_spmd.XLASPMDStrategy",
        "xla_fsdp_v2.XLAFSDPv2Strategy",
    ],
)
def test_every_xla_trainer_strategy_writes_atomically_in_the_background_by_default(strategy):
    import importlib

    module, name = strategy.split(".")
    io = getattr(importlib.import_module(f"xla_plugins.strategies.{module}"), name)().checkpoint_io
    assert type(io) is BackgroundXLACheckpointIO
    assert type(io.checkpoint_io) is AtomicXLACheckpointIO


def test_the_trainer_gets_the_background_writer_on_single_xla():
    assert type(trainer(strategy="single_xla", max_steps=1).strategy.checkpoint_io) is BackgroundXLACheckpointIO


def test_a_checkpoint_io_given_by_the_user_wins():
    from lightning.fabric.plugins import XLACheckpointIO

    given = XLACheckpointIO()
    run = trainer(strategy="single_xla", plugins=[given], max_steps=1)
    assert run.strategy.checkpoint_io is given
    from xla_plugins.strategies.single_xla import SingleDeviceXLAStrategy

    assert SingleDeviceXLAStrategy(checkpoint_io=given).checkpoint_io is given
    from xla_plugins.strategies.xla_spmd import XLASPMDStrategy

    # a strategy instance carries none until used, so Lightning takes one given beside it through `plugins`
    # (tests/scripts/sharded_writes.py gives xla_fsdp_v2 instances their held writes so, Trainer and Fabric)
    assert XLASPMDStrategy()._checkpoint_io is None


def test_the_training_steps_go_on_while_a_checkpoint_is_written_and_fit_returns_after_the_last_write(tmp_path):
    first, last = threading.Event(), threading.Event()
    writes = HeldWrites({0: first, 1: last})
    steps_during_writes: list[tuple[int, str]] = []

    class ReleasesWrites(RecordsSaves):
        def teardown(self) -> None:
            last.set()  # the last write may only finish once fit is ending
            super().teardown()

    class Watch(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if writes.pending():
                steps_during_writes.append((trainer.global_step, writes.submitted[-1]))
            if trainer.global_step == 5:
                first.set()

    run = trainer(
        strategy="single_xla",
        plugins=[ReleasesWrites(writes)],
        max_steps=8,
        callbacks=[Watch(), ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)],
    )
    try:
        run.fit(Regression(), data())
    finally:
        first.set()
        last.set()
    # ModelCheckpoint saved after step 3 and 6; steps 4 and 5 ran while the first write was held, 7 and 8
    # while the second was (after step 6 the released first write may or may not have ended yet).
    assert [entry for entry in steps_during_writes if entry[0] != 6] == [
        (4, "epoch=0-step=3.ckpt"),
        (5, "epoch=0-step=3.ckpt"),
        (7, "epoch=0-step=6.ckpt"),
        (8, "epoch=0-step=6.ckpt"),
    ]
    # fit returned after the last write ended: both files are complete.
    assert writes.events == [
        ("start", "epoch=0-step=3.ckpt"),
        ("end", "epoch=0-step=3.ckpt"),
        ("start", "epoch=0-step=6.ckpt"),
        ("end", "epoch=0-step=6.ckpt"),
    ]
    assert torch.load(tmp_path / "epoch=0-step=6.ckpt", weights_only=False)["global_step"] == 6
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"]


def test_a_save_outside_a_running_fit_is_complete_when_it_returns(tmp_path):
    gate = threading.Event()
    writes = HeldWrites({0: gate})
    io = BackgroundXLACheckpointIO(writes)
    waits = []
    wait = io.wait

    def counted_wait() -> None:
        waits.append(len(waits))
        if len(waits) == 2:  # the first wait is the save's own (one write in flight); the second, after it
            gate.set()
        wait()

    io.wait = counted_wait
    run = trainer(strategy="single_xla", plugins=[io], max_steps=2, enable_checkpointing=False)
    run.fit(Regression(), data())
    waits.clear()
    try:
        run.save_checkpoint(tmp_path / "after-fit.ckpt")
        assert writes.events == [("start", "after-fit.ckpt"), ("end", "after-fit.ckpt")]
    finally:
        gate.set()
    assert torch.load(tmp_path / "after-fit.ckpt", weights_only=False)["global_step"] == 2


def test_at_most_one_write_is_in_flight_a_second_save_waits_for_the_first(tmp_path):
    gate = threading.Event()
    writes = HeldWrites({0: gate})
    io = BackgroundXLACheckpointIO(writes)
    order: list[str] = []
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "a.ckpt")  # returns at once: the write is held
    order.append("first save returned")

    def second() -> None:
        io.save_checkpoint({"w": torch.zeros(2)}, tmp_path / "b.ckpt")
        order.append("second save returned")

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(timeout=2)  # a second save that did not wait would have returned by now
    order.append("first write released")
    gate.set()
    thread.join(timeout=60)
    io.teardown()
    assert order == ["first save returned", "first write released", "second save returned"]
    assert [kind for kind, _ in writes.events] == ["start", "end", "start", "end"]


@pytest.fixture
def transfers(monkeypatch) -> list[str]:
    """Which thread made each transfer of XLA tensors to the host (torch_xla's one-transfer copy), in order."""
    from xla_plugins.runtime import _torch_xla_contract

    made: list[str] = []
    convert = _torch_xla_contract.convert_to_cpu

    def recorded(data):
        made.append("training thread" if threading.current_thread() is threading.main_thread() else "writer")
        return convert(data)

    monkeypatch.setattr(_torch_xla_contract, "convert_to_cpu", recorded)
    return made


@pytest.mark.parametrize("copy", ["host", "device", "auto"])  # auto: a device copy on PJRT CPU
def test_the_copy_to_the_host_is_made_by_the_training_thread_or_with_a_device_copy_by_the_writer(
    tmp_path, transfers, copy
):
    gate = threading.Event()
    io = BackgroundXLACheckpointIO(HeldWrites({0: gate}), copy=copy)
    import torch_xla

    weights, count = torch.ones(3, device=torch_xla.device()), torch.zeros(1)
    io.save_checkpoint({"w": weights, "count": count}, tmp_path / "a.ckpt")
    weights.add_(1)  # the training thread goes on changing the state while the write is held
    count.add_(1)
    torch_xla.sync()
    gate.set()
    io.teardown()
    assert transfers == ["training thread" if copy == "host" else "writer"]
    saved = torch.load(tmp_path / "a.ckpt")
    assert saved["w"].tolist() == [1.0, 1.0, 1.0] and saved["count"].tolist() == [0.0]


def mocked_tpu_memory(monkeypatch, peak_bytes_used: int, bytes_limit: int) -> None:
    """Make torch_xla report a TPU with these memory figures (PJRT CPU reports none; mocked: needs TPU hardware)."""
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    monkeypatch.setattr(xr, "device_type", lambda: "TPU")
    figures = {"bytes_used": peak_bytes_used // 2, "peak_bytes_used": peak_bytes_used, "bytes_limit": bytes_limit}
    monkeypatch.setattr(xm, "get_memory_info", lambda device=None: figures)


def test_device_copy_fits_next_to_the_peak_up_to_the_share_with_mocked_tpu_memory_figures(monkeypatch):
    import torch_xla
    import torch_xla.core.xla_model as xm

    from xla_plugins.checkpoints._state_copies import DEVICE_COPY_MEMORY_SHARE, device_copy_fits

    checkpoint = {"state_dict": {"w": torch.zeros(250, device=torch_xla.device())}, "step": torch.zeros(1000)}
    assert device_copy_fits(checkpoint)  # PJRT CPU: the device's memory is the host's
    limit = 10_000
    room = int(DEVICE_COPY_MEMORY_SHARE * limit)
    mocked_tpu_memory(monkeypatch, peak_bytes_used=room - 1000, bytes_limit=limit)  # 1000 bytes: the XLA tensor
    assert device_copy_fits(checkpoint)  # the CPU tensor is not counted
    mocked_tpu_memory(monkeypatch, peak_bytes_used=room - 999, bytes_limit=limit)
    assert not device_copy_fits(checkpoint)

    def unreported(device=None):
        raise RuntimeError("Bad StatusOr access: UNIMPLEMENTED: GetAllocatorStats is not supported")

    monkeypatch.setattr(xm, "get_memory_info", unreported)
    assert not device_copy_fits(checkpoint)
    assert device_copy_fits({"step": torch.zeros(1)})  # nothing on the device: nothing to hold there


def test_the_default_copy_goes_to_the_host_when_the_device_has_no_room_with_mocked_tpu_memory_figures(
    tmp_path, monkeypatch, caplog, transfers
):
    import torch_xla

    io = BackgroundXLACheckpointIO()
    weights = torch.ones(1000, device=torch_xla.device())  # 4000 bytes
    mocked_tpu_memory(monkeypatch, peak_bytes_used=6000, bytes_limit=10_000)  # 6000 + 4000 > 9000
    with caplog.at_level("INFO", logger="xla_plugins"):
        for name in ("a", "b"):
            io.save_checkpoint({"w": weights}, tmp_path / f"{name}.ckpt")
    mocked_tpu_memory(monkeypatch, peak_bytes_used=5000, bytes_limit=10_000)  # 5000 + 4000 <= 9000
    io.save_checkpoint({"w": weights}, tmp_path / "c.ckpt")
    io.teardown()
    assert transfers == ["training thread", "training thread", "writer"]
    assert caplog.text.count("does not fit on the device") == 1  # said at the first save that falls back only
    assert torch.load(tmp_path / "a.ckpt")["w"].tolist() == torch.load(tmp_path / "c.ckpt")["w"].tolist()


def test_the_host_copy_is_taken_on_the_training_thread_before_the_hand_off(tmp_path):
    gate = threading.Event()
    io = BackgroundXLACheckpointIO(HeldWrites({0: gate}))
    weights = torch.ones(3)
    io.save_checkpoint({"w": weights}, tmp_path / "a.ckpt")
    weights.add_(1)  # the training thread goes on changing the weights while the write is held
    gate.set()
    io.teardown()
    assert torch.load(tmp_path / "a.ckpt")["w"].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_save_after_teardown_starts_a_new_writer_and_errors_reach_the_training_thread(tmp_path):
    io = BackgroundXLACheckpointIO()
    io.save_checkpoint({"w": torch.ones(1)}, tmp_path / "a.ckpt")
    io.teardown()
    io.save_checkpoint({"w": torch.ones(1)}, tmp_path / "b.ckpt")
    io.teardown()
    assert sorted(os.listdir(tmp_path)) == ["a.ckpt", "b.ckpt"]

    class Fails(AtomicXLACheckpointIO):
        def write(self, checkpoint, path):
            raise OSError(f"disk full writing {path}")

    failing = BackgroundXLACheckpointIO(Fails())
    failing.save_checkpoint({"w": torch.ones(1)}, tmp_path / "c.ckpt")
    with pytest.raises(OSError, match="disk full"):
        failing.teardown()


_KILLED_MID_WRITE = """
import io, os, sys, threading
import torch, lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from xla_plugins.checkpoints.checkpoint_io import AtomicXLACheckpointIO, BackgroundXLACheckpointIO
from linear_regression import Regression, data
from test_async_checkpoints import trainer


class HaltsInTheSecondWrite(AtomicXLACheckpointIO):
    calls = 0

    def _write_to(self, checkpoint, stream):
        HaltsInTheSecondWrite.calls += 1
        if HaltsInTheSecondWrite.calls < 2:
            return super()._write_to(checkpoint, stream)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        stream.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        stream.flush()
        os.fsync(stream.fileno())
        print("MID-WRITE", flush=True)
        threading.Event().wait()  # until killed


checkpoints = ModelCheckpoint(dirpath=sys.argv[1], save_last=True, save_top_k=0, every_n_train_steps=2)
run = trainer(
    strategy="single_xla", max_steps=50, callbacks=[checkpoints],
    plugins=[BackgroundXLACheckpointIO(HaltsInTheSecondWrite())],
)
run.fit(Regression(), data())
"""


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
def test_a_process_killed_in_the_middle_of_a_write_leaves_the_previous_checkpoint_for_ckpt_path_last(tmp_path):
    directory = tmp_path / "checkpoints"
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_KILLED_MID_WRITE), str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), *sys.path])},
    )
    try:
        for line in process.stdout:
            if line.strip() == "MID-WRITE":
                break
        else:
            pytest.fail("the subprocess ended before its second write")
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    names = sorted(os.listdir(directory))
    assert names[0].startswith(".last.ckpt.tmp-") and names[1:] == ["last.ckpt"], names
    assert torch.load(directory / "last.ckpt", weights_only=False)["global_step"] == 2

    resumed_at: list[int] = []

    class Record(L.Callback):
        def on_train_start(self, trainer, pl_module):
            resumed_at.append(trainer.global_step)

    run = trainer(
        strategy="single_xla",
        max_steps=4,
        callbacks=[Record(), ModelCheckpoint(dirpath=directory, save_last=True, save_top_k=0)],
    )
    run.fit(Regression(), data(), ckpt_path="last")
    assert resumed_at == [2]
    assert sorted(os.listdir(directory)) == ["last-v1.ckpt", "last.ckpt"]  # the killed writer's temporary file: gone


def _a_dead_process_id() -> int:
    """The id of a process of this host that has ended (a Python run to its end and reaped)."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(ended.stdout)


def test_only_temporaries_of_killed_writers_of_this_host_are_removed_by_the_next_write_or_load(tmp_path):
    import socket

    from trainer_plugins.long_runs import _commits

    host, dead = socket.gethostname(), _a_dead_process_id()
    killed_file = f".m.ckpt.tmp-{host}-{dead}-0123456789ab"
    killed_directory = f".sharded.tmp-{host}-{dead}-0123456789ac"  # a sharded checkpoint's staging directory
    set_aside = f".m.ckpt.old-{host}-{dead}-0123456789ad"  # an earlier m.ckpt set aside by a killed writer
    kept = {
        os.path.basename(_commits.temporary_path(tmp_path / "m.ckpt")): "a live writer's (this process)",
        f".m.ckpt.tmp-another-host-{dead}-0123456789ae": "another host's: its process cannot be checked here",
        f".gone.ckpt.old-{host}-{dead}-0123456789af": "the only copy of gone.ckpt, set aside by a killed writer",
        ".m.ckpt.tmp-notes": "not a name of ours",
    }
    for name in [killed_file, set_aside, *kept]:
        (tmp_path / name).write_bytes(b"13 MB, say")
    (tmp_path / killed_directory).mkdir()
    (tmp_path / killed_directory / "shard-0").write_bytes(b"shard")

    AtomicXLACheckpointIO().save_checkpoint({"step": torch.tensor(1)}, tmp_path / "m.ckpt")
    # set_aside was the only copy of m.ckpt when the write began: kept
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.ckpt", set_aside, *kept])

    (tmp_path / killed_file).write_bytes(b"killed again")
    assert AtomicXLACheckpointIO().load_checkpoint(tmp_path / "m.ckpt")["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.ckpt", *kept])


class Interrupted(Exception):
    pass


def test_a_wait_interrupted_by_a_signal_leaves_the_write_pending_for_the_next_wait(tmp_path):
    from concurrent.futures import Future

    from test_fabric_background_saves import HeldMidWrite

    gate, interrupted = threading.Event(), threading.Event()
    writes = HeldMidWrite(held=0, gate=gate)
    io = BackgroundXLACheckpointIO(writes)
    main = threading.get_ident()

    def interrupt(signum, frame):
        while frame is not None and frame.f_code is not Future.result.__code__:
            frame = frame.f_back
        if frame is not None and not interrupted.is_set():  # only while the wait waits for the write
            interrupted.set()
            raise Interrupted

    def signal_the_waiting_thread() -> None:
        assert writes.reached.wait(timeout=120)
        while not interrupted.wait(timeout=0.05):  # again until it lands inside the wait
            signal.pthread_kill(main, signal.SIGUSR1)

    before = signal.signal(signal.SIGUSR1, interrupt)
    path = tmp_path / "held.ckpt"
    try:
        io.save_checkpoint({"step": torch.tensor(5)}, path)
        threading.Thread(target=signal_the_waiting_thread).start()
        with pytest.raises(Interrupted):
            io.wait()  # as a stop signal's SystemExit interrupts the wait of fabric.save or exit_after_stop
        releaser = threading.Timer(0.5, gate.set)  # a second wait that did not wait would return before it
        releaser.start()
        io.wait()
        assert torch.load(path, weights_only=False)["step"] == 5
    finally:
        gate.set()
        signal.signal(signal.SIGUSR1, before)
        io.teardown()


def test_on_an_object_store_a_checkpoint_counts_only_once_its_commit_marker_is_written():
    fs = fsspec.filesystem("memory")
    root = "memory://async-checkpoints-test/ckpts"
    run = trainer(
        strategy="single_xla",
        max_steps=4,
        callbacks=[ModelCheckpoint(dirpath=root, save_last=True, save_top_k=0, every_n_train_steps=2)],
    )
    run.fit(Regression(), data())
    last = f"{root}/last.ckpt"
    with fs.open(f"{last}.commit", "rb") as marker:
        assert marker.read() == str(fs.size(last)).encode()
    assert is_committed(last)
    assert [os.path.basename(p) for p in sorted(fs.ls(root, detail=False))] == ["last.ckpt", "last.ckpt.commit"]

    from trainer_plugins._lightning_checkpoint import last_checkpoint

    # a newer last checkpoint without its marker (a writer killed after moving it into place) is skipped
    with fs.open(f"{root}/last-v1.ckpt", "wb") as stream:
        stream.write(b"half a checkpoint")
    assert not is_committed(f"{root}/last-v1.ckpt")
    follow_up = trainer(
        strategy="single_xla", max_steps=6, callbacks=[ModelCheckpoint(dirpath=root, save_last=True, save_top_k=0)]
    )
    assert last_checkpoint(follow_up) == "memory:///async-checkpoints-test/ckpts/last.ckpt"

    resumed_at: list[int] = []

    class Record(L.Callback):
        def on_train_start(self, trainer, pl_module):
            resumed_at.append(trainer.global_step)

    follow_up.callbacks.append(Record())
    follow_up.fit(Regression(), data(), ckpt_path="last")
    assert resumed_at == [4]

    # without any marker nothing is complete: "last" finds nothing, as Lightning says when there is none
    for path in fs.find(root):
        if path.endswith(".commit"):
            fs.rm(path)
    fresh = trainer(strategy="single_xla", max_steps=1, callbacks=[ModelCheckpoint(dirpath=root, save_last=True)])
    assert last_checkpoint(fresh) is None
    fs.rm(root, recursive=True)


def _fit_and_resume(directory, writes: str, monkeypatch) -> tuple[dict, type]:
    monkeypatch.setenv(WRITES_VARIABLE, writes)
    first = trainer(
        strategy="single_xla", max_steps=4, callbacks=[ModelCheckpoint(dirpath=directory, save_last=True, save_top_k=0)]
    )
    first.fit(Regression(), data())
    io_type = type(first.strategy.checkpoint_io)
    second = trainer(
        strategy="single_xla", max_steps=8, callbacks=[ModelCheckpoint(dirpath=directory, save_last=True, save_top_k=0)]
    )
    model = Regression()
    second.fit(model, data(), ckpt_path="last")
    return {k: v.cpu() for k, v in model.state_dict().items()}, io_type


@pytest.mark.slow  # a longer single-device run: primary tox cell only (tox.ini)
@pytest.mark.parametrize("writes", ["background", "host-copy"])
def test_a_resume_from_a_background_written_checkpoint_equals_one_from_a_synchronous_write(
    tmp_path, monkeypatch, writes
):
    background, background_io = _fit_and_resume(tmp_path / "background", writes, monkeypatch)
    sync, sync_io = _fit_and_resume(tmp_path / "sync", "sync", monkeypatch)
    assert (background_io, sync_io) == (BackgroundXLACheckpointIO, AtomicXLACheckpointIO)
    first_background = torch.load(tmp_path / "background" / "last.ckpt", weights_only=False)
    first_sync = torch.load(tmp_path / "sync" / "last.ckpt", weights_only=False)
    assert first_background["global_step"] == first_sync["global_step"] == 8
    for key in background:
        assert torch.equal(background[key], sync[key]), key
        assert torch.equal(first_background["state_dict"][key], first_sync["state_dict"][key]), key


def test_the_writes_setting_switches_background_writes_off_and_a_bad_value_names_the_choices(monkeypatch):
    monkeypatch.setenv(WRITES_VARIABLE, "sync")
    assert type(default_checkpoint_io()) is AtomicXLACheckpointIO
    for value, copy in ((" Background ", "auto"), ("", "auto"), ("device-copy", "device"), ("host-copy", "host")):
        monkeypatch.setenv(WRITES_VARIABLE, value)
        assert type(default_checkpoint_io()) is BackgroundXLACheckpointIO and default_checkpoint_io().copy == copy
    with pytest.raises(ValueError, match=r"copy='gpu' is not valid: choose one of \['auto', 'host', 'device'\]"):
        BackgroundXLACheckpointIO(copy="gpu")
    monkeypatch.setenv(WRITES_VARIABLE, "async")
    with pytest.raises(
        ValueError,
        match=r"WRITES='async' is not valid: choose one of \['background', 'sync', 'device-copy', 'host-copy'\]",
    ):
        default_checkpoint_io()
    with pytest.raises(ValueError, match="XLA_PLUGINS_CHECKPOINT_WRITES='async'"):
        trainer(strategy="single_xla", max_steps=1).fit(Regression(), data())

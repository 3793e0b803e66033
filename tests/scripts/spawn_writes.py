"""Background checkpoint writes of the spawn strategy (``"xla"``) on N PJRT CPU devices, for
tests/test_spawn_background_checkpoints.py.

Through tests/xla_cpu_harness.py: the workers' replicas are threads of one process, so the events
holding a write (module globals of this script, made anew in the worker) are shared by the replicas.

* Trainer: a fit saving a checkpoint every 3 steps; in the worker, rank 0's first write is held until
  step 5 and the last until ``fit`` tears the checkpoint IO down. Rank 0 writes the steps that ran
  while a write was held and the writes' order to ``<out>/trainer-worker.json``; the main process
  adds what it found once ``fit`` returned.
* Fabric: rank 0's ``fabric.save`` returns with its write held; every rank then calls
  ``fabric.load`` (rank 1 first, while the write is still held) and records the step it read.

Writes ``<out>/report.json``. Run as a script (``if __name__ == "__main__"``), as XLA launching needs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import xla_cpu_harness  # noqa: E402

xla_cpu_harness.install()

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from linear_regression import Regression, data  # noqa: E402
from torch import nn  # noqa: E402

from xla_plugins.checkpoints.checkpoint_io import AtomicXLACheckpointIO, BackgroundXLACheckpointIO  # noqa: E402

GATES = {0: threading.Event(), 1: threading.Event()}
EVENTS: list = []
SUBMITTED: list = []  # the saves handed to rank 0's writer, recorded on the training thread
DURING: list = []
AT_LOAD: dict[int, threading.Event] = {1: threading.Event()}


class HeldWrites(AtomicXLACheckpointIO):
    """Atomic writes recording start and end in :data:`EVENTS`; write ``i`` waits for ``GATES[i]``."""

    def write(self, checkpoint, path) -> None:
        number = sum(1 for kind, _ in EVENTS if kind == "start")
        EVENTS.append(("start", os.path.basename(path)))
        gate = GATES.get(number)
        if gate is not None:
            assert gate.wait(timeout=300), "the script never released the write"
        super().write(checkpoint, path)
        EVENTS.append(("end", os.path.basename(path)))


def pending() -> bool:
    """Whether a save handed to the writer has not ended (from the hand-off, before the writer starts it)."""
    return len(SUBMITTED) > sum(kind == "end" for kind, _ in EVENTS)


class ReleasesWrites(BackgroundXLACheckpointIO):
    def __init__(self, out: str) -> None:
        super().__init__(HeldWrites())
        self.out = out

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        SUBMITTED.append(os.path.basename(path))
        super().save_checkpoint(checkpoint, path, storage_options)

    def teardown(self) -> None:
        if self._pending is not None:  # the replica that writes (every replica tears its own copy down)
            GATES[1].set()  # the last write may only finish once fit is ending
        super().teardown()
        with open(os.path.join(self.out, "trainer-worker.json"), "w") as file:
            json.dump({"events": EVENTS, "during": DURING, "pid": os.getpid()}, file)


class Watch(L.Callback):
    """Rank 0's steps during held writes; its fit's end (the replica threads' ranks are told apart while training)."""

    rank_zero_thread = None

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_rank != 0:
            return
        Watch.rank_zero_thread = threading.current_thread()
        if pending():
            DURING.append([trainer.global_step, SUBMITTED[-1]])
        if trainer.global_step == 5:
            GATES[0].set()

    def teardown(self, trainer, pl_module, stage):  # Lightning calls it after the strategy's teardown
        if threading.current_thread() is Watch.rank_zero_thread:
            EVENTS.append(("fit ends", "epoch=-"))


def trainer_part(out: str, devices: int) -> dict:
    directory = os.path.join(out, "trainer")
    trainer = L.Trainer(
        accelerator="xla",
        strategy="xla",
        devices=devices,
        max_steps=8,
        default_root_dir=out,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        plugins=[ReleasesWrites(out)],
        callbacks=[Watch(), ModelCheckpoint(dirpath=directory, every_n_train_steps=3, save_top_k=-1)],
    )
    default = L.Trainer(accelerator="xla", strategy="xla", devices=devices, logger=False, default_root_dir=out)
    default_io = default.strategy.checkpoint_io
    trainer.fit(Regression(), data(128))
    with open(os.path.join(out, "trainer-worker.json")) as file:
        worker = json.load(file)
    return {
        **worker,
        "default_io": type(default_io).__name__,
        "main_pid": os.getpid(),
        "left": sorted(os.listdir(directory)),
        "global_steps": {
            name: torch.load(os.path.join(directory, name), weights_only=False)["global_step"]
            for name in sorted(os.listdir(directory))
        },
    }


def fabric_part(out: str, devices: int) -> dict:
    path = os.path.join(out, "fabric.ckpt")
    fabric = L.Fabric(accelerator="xla", strategy="xla", devices=devices)
    default = type(fabric.strategy.checkpoint_io).__name__
    # Lightning's Fabric XLA strategy accepts XLACheckpointIO plugins only
    fabric.strategy._checkpoint_io = BackgroundXLACheckpointIO(HeldWrites())

    def run(fabric) -> None:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        module, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        rank = fabric.global_rank
        GATES[0].set()  # the first save is written at once
        fabric.save(path, {"model": module, "step": 0})
        fabric.strategy.wait_for_checkpoint_writes()
        fabric.barrier()
        GATES[1].clear()
        fabric.save(path, {"model": module, "step": 1})  # rank 0 writes it; held until rank 0 waits for it
        if rank == 0:
            held = fabric.strategy.checkpoint_io._pending  # this worker's copy; its write is held by the gate
            EVENTS.append(("pending after save", str(held is not None and not held.done())))
            assert AT_LOAD[1].wait(timeout=300)  # rank 1 is loading already
            io = fabric.strategy.checkpoint_io  # this worker's copy
            wait = io.wait

            def releasing_wait() -> None:
                EVENTS.append(("rank 0 waits", ""))
                GATES[1].set()
                wait()

            io.wait = releasing_wait
        else:
            EVENTS.append((f"rank {rank} loads", ""))
            AT_LOAD.get(rank, threading.Event()).set()
        state = {"model": module, "step": -1}
        fabric.load(path, state)
        EVENTS.append((f"rank {rank} read step", str(state["step"])))
        fabric.barrier()
        if rank == 0:
            with open(os.path.join(out, "fabric-worker.json"), "w") as file:
                json.dump({"events": EVENTS, "left": sorted(os.listdir(out))}, file)

    fabric.launch(run)
    with open(os.path.join(out, "fabric-worker.json")) as file:
        return {"default_io": default, **json.load(file)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    report = {"trainer": trainer_part(args.out, args.devices)}
    EVENTS.clear()
    for gate in GATES.values():
        gate.clear()
    report["fabric"] = fabric_part(args.out, args.devices)
    with open(os.path.join(args.out, "report.json"), "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    main()

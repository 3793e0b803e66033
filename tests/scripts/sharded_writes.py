"""Sharded ``xla_fsdp_v2`` checkpoints written in the background, on N PJRT CPU devices, for
tests/test_sharded_background_checkpoints.py.

Scenarios (``--scenario``), each writing ``<out>/report.json``:

* ``background``: a Trainer fit saving a sharded checkpoint every 3 steps while the first write is
  held until step 5 and the last until ``fit`` tears its checkpoint IO down (events, no timing); the
  steps that ran during each held write, the writes' order, the directories left. Then Fabric's
  sharded and full ``fabric.save`` with a held write: what exists while it is held, and that
  ``fabric.load`` waited for it. Then ``memory://``: a fit with ``ModelCheckpoint(save_last=True)``
  there, its commit marker, ``ckpt_path="last"`` with a newer uncommitted ``last-v1.ckpt``, and without markers.
* ``killed``: a fit saving ``last.ckpt`` (sharded) every 2 steps; the second write stops after its
  shards and before ``meta.pt`` and its commit, prints ``MID-WRITE`` and waits to be killed. The weights at
  each save go to ``<out>/weights-<step>.json`` first.
* ``resume``: ``fit(ckpt_path="last")`` in ``<out>``: the global step and the weights training started from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from xla_plugins.checkpoints.checkpoint_io import AtomicXLACheckpointIO, BackgroundXLACheckpointIO


class Regression(L.LightningModule):
    def __init__(self, out: str = "") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(8, 4)
        self.out = out
        self.started_from: list = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.1)

    def on_train_start(self) -> None:
        self.started_from = [self.global_step, weights(self)]

    def on_save_checkpoint(self, checkpoint) -> None:
        if self.out:
            with open(os.path.join(self.out, f"weights-{self.global_step}.json"), "w") as file:
                json.dump(weights(self), file)


def weights(module: nn.Module) -> list[float]:
    return [x for p in module.parameters() for x in p.detach().cpu().flatten().tolist()]


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    samples = TensorDataset(torch.randn(256, 8, generator=generator), torch.randn(256, 4, generator=generator))
    return DataLoader(samples, batch_size=4)


def trainer(io=None, **flags) -> L.Trainer:
    from xla_plugins.strategies.xla_fsdp_v2 import XLAFSDPv2Strategy

    defaults = dict(
        accelerator="xla",
        devices="auto",
        strategy=XLAFSDPv2Strategy(state_dict_type="sharded"),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        plugins=[io] if io is not None else None,
    )
    return L.Trainer(**{**defaults, **flags})


class HeldShardedWrites(AtomicXLACheckpointIO):
    """Atomic writes recording start and end; write number ``i`` waits for ``gates[i]`` if there is one."""

    def __init__(self, gates: dict[int, threading.Event]) -> None:
        super().__init__()
        self.gates = gates
        self.events: list[tuple[str, str]] = []
        self.submitted: list[str] = []  # recorded on the training thread at each hand-off (ReleasesWrites)
        self.reached = threading.Event()  # set when a held write waits at its gate

    def _held(self, path, write) -> None:
        number = sum(1 for kind, _ in self.events if kind == "start")
        self.events.append(("start", os.path.basename(path)))
        gate = self.gates.get(number)
        if gate is not None:
            self.reached.set()
            assert gate.wait(timeout=300), "the script never released the write"
        write()
        self.events.append(("end", os.path.basename(path)))

    def write_sharded(self, path, *args, **kwargs) -> None:
        self._held(path, lambda: super(HeldShardedWrites, self).write_sharded(path, *args, **kwargs))

    def write(self, checkpoint, path) -> None:
        self._held(path, lambda: super(HeldShardedWrites, self).write(checkpoint, path))

    def pending(self) -> bool:
        """Whether a save handed to the writer has not ended (from the hand-off, before the writer starts it)."""
        return len(self.submitted) > sum(kind == "end" for kind, _ in self.events)


def trainer_in_the_background(out: str) -> dict:
    first, last = threading.Event(), threading.Event()
    writes = HeldShardedWrites({0: first, 1: last})
    during: list = []

    class ReleasesWrites(BackgroundXLACheckpointIO):
        def save_sharded(self, path, *args, **kwargs) -> None:
            writes.submitted.append(os.path.basename(path))
            super().save_sharded(path, *args, **kwargs)

        def teardown(self) -> None:
            last.set()  # the last write may only finish once fit is ending
            super().teardown()

    class Watch(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if writes.pending():
                during.append([trainer.global_step, writes.submitted[-1]])
            if trainer.global_step == 5:
                first.set()

    directory = os.path.join(out, "background")
    run = trainer(
        ReleasesWrites(writes),
        max_steps=8,
        callbacks=[Watch(), ModelCheckpoint(dirpath=directory, every_n_train_steps=3, save_top_k=-1)],
    )
    model = Regression()
    run.fit(model, data())
    step6 = torch.load(os.path.join(directory, "epoch=0-step=6.ckpt", "meta.pt"), weights_only=False)
    return {
        "io": type(trainer().strategy.checkpoint_io).__name__,
        "during": during,
        "events": writes.events,
        "left": sorted(os.listdir(directory)),
        "files_of_step6": sorted(os.listdir(os.path.join(directory, "epoch=0-step=6.ckpt"))),
        "global_step_of_step6": step6["global_step"],
    }


def fabric_in_the_background(out: str, state_dict_type: str) -> dict:
    from xla_plugins.strategies.xla_fsdp_v2 import FabricXLAFSDPv2Strategy

    gate = threading.Event()
    writes = HeldShardedWrites({1: gate})  # the second save's write is held
    io = BackgroundXLACheckpointIO(writes)
    report = {"default_io": type(FabricXLAFSDPv2Strategy().checkpoint_io).__name__}
    strategy = FabricXLAFSDPv2Strategy(state_dict_type=state_dict_type)
    fabric = L.Fabric(accelerator="xla", devices="auto", strategy=strategy, plugins=[io])
    report["given_io_kept"] = fabric.strategy.checkpoint_io is io
    fabric.launch()
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    module, optimizer = fabric.setup(model, torch.optim.Adam(model.parameters(), lr=0.1))
    path = os.path.join(out, f"fabric-{state_dict_type}.ckpt")
    fabric.save(path, {"model": module, "optimizer": optimizer, "step": 0})
    io.wait()
    fabric.backward(module(torch.randn(16, 8, device=fabric.device)).square().mean())
    optimizer.step()
    saved = weights(module)
    fabric.save(path, {"model": module, "optimizer": optimizer, "step": 1})
    report["pending_after_save"] = io._pending is not None and not io._pending.done()  # held by the gate
    assert writes.reached.wait(timeout=300)  # the writer started it: the events below come in one order
    report["step_while_held"] = (
        torch.load(os.path.join(path, "meta.pt")) if os.path.isdir(path) else torch.load(path)
    )["step"]
    wait = io.wait

    def releasing_wait() -> None:
        writes.events.append(("load waits", ""))
        gate.set()
        wait()

    io.wait = releasing_wait
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.zero_()
    state = {"model": module, "optimizer": optimizer, "step": -1}
    fabric.load(path, state)
    writes.events.append(("loaded", ""))
    kinds = [kind for kind, _ in writes.events]
    report["events"] = [kind for i, kind in enumerate(kinds) if kind != "load waits" or kind not in kinds[:i]]
    report["loaded_step"] = state["step"]
    report["loaded_equal"] = weights(module) == saved
    report["left"] = sorted(os.listdir(out))
    return report


def memory_last(out: str) -> dict:
    import fsspec

    from trainer_plugins._lightning_checkpoint import last_checkpoint

    fs = fsspec.filesystem("memory")
    root = "memory://sharded-writes/ckpts"
    run = trainer(
        max_steps=4, callbacks=[ModelCheckpoint(dirpath=root, save_last=True, save_top_k=0, every_n_train_steps=2)]
    )
    run.fit(Regression(), data())
    last = f"{root}/last.ckpt"
    report: dict = {"listing": sorted(p.rsplit("/", 1)[1] for p in fs.ls(root, detail=False))}
    with fs.open(f"{last}.commit", "rb") as marker:
        report["marker"] = marker.read().decode()
    report["size"] = fs.du(last, total=True)
    report["committed"] = run.strategy.checkpoint_io.is_committed(last)
    # a newer last checkpoint without its marker (a writer killed before committing it) is skipped
    fs.mkdir(f"{root}/last-v1.ckpt")
    for name in fs.ls(last, detail=False):
        fs.copy(name, f"{root}/last-v1.ckpt/{name.rsplit('/', 1)[1]}")
    follow_up = trainer(max_steps=6, callbacks=[ModelCheckpoint(dirpath=root, save_last=True, save_top_k=0)])
    report["uncommitted_is_committed"] = follow_up.strategy.checkpoint_io.is_committed(f"{root}/last-v1.ckpt")
    report["last"] = last_checkpoint(follow_up)
    model = Regression()
    follow_up.fit(model, data(), ckpt_path="last")
    report["resumed_at"] = model.started_from[0]
    for path in fs.find(root):
        if path.endswith(".commit"):
            fs.rm(path)
    fresh = trainer(max_steps=1, callbacks=[ModelCheckpoint(dirpath=root, save_last=True)])
    report["last_without_markers"] = last_checkpoint(fresh)
    fs.rm(root, recursive=True)
    return report


def killed(out: str) -> None:
    import xla_plugins.checkpoints.checkpoint_io as checkpoint_io

    real = checkpoint_io.write_directory
    calls = []

    def stops_in_the_second_write(directory, shards, metadata, process_group=None):
        calls.append(directory)
        if len(calls) < 2:
            return real(directory, shards, metadata, process_group)
        real(directory, shards, None, process_group)  # the shards, not meta.pt, and no commit
        print("MID-WRITE", flush=True)
        threading.Event().wait()  # until killed

    checkpoint_io.write_directory = stops_in_the_second_write
    checkpoints = ModelCheckpoint(
        dirpath=os.path.join(out, "checkpoints"), save_last=True, save_top_k=0, every_n_train_steps=2
    )
    trainer(max_steps=50, callbacks=[checkpoints]).fit(Regression(out), data())


def resume(out: str) -> dict:
    checkpoints = ModelCheckpoint(dirpath=os.path.join(out, "checkpoints"), save_last=True, save_top_k=0)
    model = Regression()
    trainer(max_steps=4, callbacks=[checkpoints]).fit(model, data(), ckpt_path="last")
    return {"started_at": model.started_from[0], "weights": model.started_from[1]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenario", choices=["background", "killed", "resume"], required=True)
    args = parser.parse_args()
    if args.scenario == "killed":
        killed(args.out)
        sys.exit("the killed scenario ended without being killed")
    if args.scenario == "resume":
        report = resume(args.out)
    else:
        report = {
            "trainer": trainer_in_the_background(args.out),
            "fabric": {kind: fabric_in_the_background(args.out, kind) for kind in ("sharded", "full")},
            "memory": memory_last(args.out),
        }
    with open(os.path.join(args.out, "report.json"), "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    main()

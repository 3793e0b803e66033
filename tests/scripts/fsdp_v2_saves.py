"""Repeated full checkpoints of ``xla_fsdp_v2`` on N PJRT CPU devices, for tests/test_fsdp_v2_saves.py.

A model of four tensors (two ``Linear``) trained two steps with Adam is saved three times in a row,
with the Trainer (``trainer.save_checkpoint``) and with Fabric (``fabric.save``), in the format
``--format``. Writes ``<out>/report.json``: per API, the programs torch_xla compiled during each
save (the count of its ``CompileTime`` metric, which every compilation records, torch_xla's
replication of a sharded tensor for a transfer included), and whether the saved model and Adam
tensors equal the model's and optimizer's (full format); for the full format also the programs compiled
in each of 5 epochs of a Trainer fit whose ``ModelCheckpoint`` saves the top 2 and the last every epoch;
for the Trainer also the programs compiled by the strategy's teardown (which moves the sharded state to the
CPU) and whether the moved parameters and Adam's state are on the CPU and equal the trained values.
"""

from __future__ import annotations

import argparse
import json
import os

import lightning as L
import torch
import torch_xla.debug.metrics as met
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SAVES = 3


def compilations() -> int:
    data = met.metric_data("CompileTime")
    return data[0] if data else 0


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))


def loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(32, 8, generator=torch.Generator().manual_seed(0))), batch_size=4)


def full(tensors: dict) -> dict:
    """CPU copies of ``tensors`` (read after the saves were counted: this read compiles, as torch_xla's does)."""
    return {k: v.cpu() for k, v in tensors.items() if isinstance(v, torch.Tensor)}


def equal(saved: dict, live: dict) -> bool:
    return saved.keys() == live.keys() and all(torch.equal(saved[k], live[k]) for k in live)


def saves(save) -> list[int]:
    counts = []
    for index in range(SAVES):
        before = compilations()
        save(index)
        counts.append(compilations() - before)
    return counts


class Model(L.LightningModule):
    def __init__(self, out: str, state_dict_type: str) -> None:
        super().__init__()
        self.net = net()
        self.out, self.format = out, state_dict_type
        self.report: dict = {}

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.1)

    def on_train_end(self) -> None:
        paths = [os.path.join(self.out, f"trainer-{i}.ckpt") for i in range(SAVES)]
        self.report["compiled"] = saves(lambda i: self.trainer.save_checkpoint(paths[i]))
        if self.format == "full":
            self.trainer.strategy.checkpoint_io.wait()  # the last save is written in the background
            saved = torch.load(paths[-1], weights_only=True)
            optimizer = self.trainer.optimizers[0]
            live = full(self.state_dict())
            self.report["model_equal"] = equal(saved["state_dict"], live)
            states = saved["optimizer_states"][0]["state"]
            params = list(self.parameters())
            self.report["optimizer_equal"] = all(
                equal(full(states[i]), full(optimizer.state[p])) for i, p in enumerate(params)
            )
            self.report["shapes"] = {k: list(v.shape) for k, v in saved["state_dict"].items()}
        self.live = full(self.state_dict())
        self.report["mark_before_teardown"] = compilations()


def trainer_run(out: str, state_dict_type: str) -> dict:
    from xla_plugins.strategies.xla_fsdp_v2 import XLAFSDPv2Strategy

    torch.manual_seed(0)
    model = Model(out, state_dict_type)
    trainer = L.Trainer(
        accelerator="xla",
        devices="auto",
        strategy=XLAFSDPv2Strategy(state_dict_type=state_dict_type),
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader())
    # the strategy's teardown moved the sharded parameters and Adam's state to the CPU
    model.report["teardown_compiled"] = compilations() - model.report.pop("mark_before_teardown")
    model.report["on_the_cpu_after_fit"] = all(p.device.type == "cpu" for p in model.parameters()) and all(
        t.device.type == "cpu"
        for state in trainer.optimizers[0].state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )
    model.report["equal_after_fit"] = equal(model.state_dict(), model.live)
    return model.report


class CountsEachEpoch(Model):
    """Logs its epoch loss (ModelCheckpoint monitors it) and counts the programs compiled in each epoch."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss, on_step=False, on_epoch=True)
        return loss

    def on_train_epoch_start(self) -> None:
        self.report.setdefault("per_epoch", [])
        self.report.setdefault("mark", compilations())

    def on_train_end(self) -> None:
        self.report["per_epoch"].append(compilations() - self.report["mark"])

    def on_train_batch_start(self, batch, batch_idx) -> None:
        if batch_idx == 0 and self.current_epoch > 0:  # the previous epoch, its checkpoints included
            self.report["per_epoch"].append(compilations() - self.report["mark"])
            self.report["mark"] = compilations()


def trainer_epochs(out: str, epochs: int = 5) -> list[int]:
    """Programs compiled per epoch of a fit saving top-2 and last checkpoints (full format) every epoch."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    torch.manual_seed(0)
    model = CountsEachEpoch(out, "full")
    trainer = L.Trainer(
        accelerator="xla",
        devices="auto",
        strategy="xla_fsdp_v2",
        max_epochs=epochs,
        callbacks=[ModelCheckpoint(dirpath=os.path.join(out, "epochs"), monitor="loss", save_top_k=2, save_last=True)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader())
    return model.report["per_epoch"]


def fabric_run(out: str, state_dict_type: str) -> dict:
    from xla_plugins.strategies.xla_fsdp_v2 import FabricXLAFSDPv2Strategy

    torch.manual_seed(0)
    fabric = L.Fabric(
        accelerator="xla", devices="auto", strategy=FabricXLAFSDPv2Strategy(state_dict_type=state_dict_type)
    )
    fabric.launch()
    model = net()
    module, optimizer = fabric.setup(model, torch.optim.Adam(model.parameters(), lr=0.1))
    for step, (x,) in enumerate(fabric.setup_dataloaders(loader())):
        if step == 2:
            break
        optimizer.zero_grad()
        fabric.backward(module(x).pow(2).mean())
        optimizer.step()
    paths = [os.path.join(out, f"fabric-{i}.ckpt") for i in range(SAVES)]
    report: dict = {"compiled": saves(lambda i: fabric.save(paths[i], {"model": module, "optimizer": optimizer}))}
    if state_dict_type == "full":
        fabric.strategy.wait_for_checkpoint_writes()  # fabric.save writes in the background; read it here
        saved = torch.load(paths[-1], weights_only=True)
        report["model_equal"] = equal(saved["model"], full(module.state_dict()))
        states = saved["optimizer"]["state"]
        report["optimizer_equal"] = all(
            equal(full(states[i]), full(optimizer.state[p])) for i, p in enumerate(module.parameters())
        )
        report["shapes"] = {k: list(v.shape) for k, v in saved["model"].items()}
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--format", default="full")
    args = parser.parse_args()
    report = {"trainer": trainer_run(args.out, args.format), "fabric": fabric_run(args.out, args.format)}
    if args.format == "full":
        report["per_epoch"] = trainer_epochs(args.out)
    with open(os.path.join(args.out, "report.json"), "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    main()

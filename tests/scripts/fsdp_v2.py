"""Fully sharded training (``xla_fsdp_v2``) on N PJRT CPU devices, for tests/test_xla_fsdp_v2.py.

One interpreter runs every scenario of one API (``--api trainer`` or ``--api fabric``), so each
graph is compiled once, and writes ``<out>/report.json``: per-step losses of ``xla_spmd`` and
``xla_fsdp_v2`` on the same seed and data (gradient clipping by norm engaged, two batches
accumulated), sharding specs, checkpoint contents, resumed step counts and losses, dtypes per
precision, a 2-D mesh run and a bad mesh's error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import lightning as L
import torch
from fsdp_v2_net import Block, Net, data
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader

DEVICES = int(os.environ["CPU_NUM_DEVICES"])
BATCH = 4
CLIP = 0.5  # small: the gradient norm exceeds it, so clipping changes every step


def spec(tensor: torch.Tensor) -> str:
    import torch_xla  # imported here: the checkpoint check imports this module without torch_xla

    return torch_xla._XLAC._get_xla_sharding_spec(tensor)


def total_norm(parameters) -> torch.Tensor:
    return torch.stack([p.grad.detach().float().norm() for p in parameters if p.grad is not None]).norm()


class Model(L.LightningModule):
    def __init__(self, optimizer: str = "adam") -> None:
        super().__init__()
        self.net = Net()
        self.optimizer = optimizer
        self.losses: list[torch.Tensor] = []
        self.norms: list[torch.Tensor] = []
        self.seen: dict = {}

    def on_before_optimizer_step(self, optimizer) -> None:
        self.norms.append(total_norm(self.parameters()))  # Lightning clips right after this hook

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.losses.append(loss.detach())
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def on_train_start(self) -> None:
        optimizer = self.trainer.optimizers[0]
        weight = self.net.block.linear.weight
        state = optimizer.state.get(weight, {})
        self.seen["start_step"] = self.trainer.global_step
        self.seen["start_exp_avg"] = float(state["exp_avg"].abs().sum()) if state else None
        self.seen["start_exp_avg_spec"] = spec(state["exp_avg"]) if state else None

    def on_train_end(self) -> None:
        weight = self.net.block.linear.weight
        self.seen["weight_spec"] = spec(weight)
        self.seen["weight_dtype"] = str(weight.dtype)
        state = self.trainer.optimizers[0].state[weight]
        self.seen["state_spec"] = spec(state["exp_avg" if "exp_avg" in state else "momentum_buffer"])
        self.seen["losses"] = [float(loss) for loss in self.losses]
        self.seen["norms"] = [float(norm) for norm in self.norms]

    def configure_optimizers(self):
        if self.optimizer == "sgd":  # float16 Adam divides by an eps that float16 rounds to 0
            return torch.optim.SGD(self.parameters(), lr=1e-2, momentum=0.9)
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def trainer_run(strategy, epochs: int, out: str, name: str, ckpt_path=None, precision="32-true", every_epoch=False):
    L.seed_everything(0)
    model = Model("sgd" if precision == "16-true" else "adam")
    callbacks = (
        [ModelCheckpoint(dirpath=os.path.join(out, name), save_top_k=-1, every_n_epochs=1)] if every_epoch else []
    )
    trainer = L.Trainer(
        accelerator="xla",
        devices="auto",
        strategy=strategy,
        precision=precision,
        max_epochs=epochs,
        gradient_clip_val=CLIP,
        accumulate_grad_batches=2,
        callbacks=callbacks,
        enable_checkpointing=every_epoch,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(data(), batch_size=BATCH)
    trainer.fit(model, loader, loader, ckpt_path=ckpt_path)
    row = dict(model.seen, global_step=trainer.global_step, val_loss=float(trainer.callback_metrics["val_loss"]))
    row["strategy"] = type(trainer.strategy).__name__
    return row, trainer, model, loader


def trainer_scenarios(out: str) -> dict:
    from xla_plugins.strategies.xla_fsdp_v2 import XLAFSDPv2Strategy

    report: dict = {}
    report["spmd"], trainer, model, loader = trainer_run("xla_spmd", 2, out, "spmd")
    report["spmd"]["predicted"] = torch.cat(trainer.predict(model, loader)).flatten().tolist()

    wrapped = XLAFSDPv2Strategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block})
    report["fsdp"], trainer, model, loader = trainer_run(wrapped, 2, out, "full", every_epoch=True)
    report["fsdp"]["predicted"] = torch.cat(trainer.predict(model, loader)).flatten().tolist()
    report["fsdp"]["plain_after_fit"] = type(model.net.block).__name__
    full = os.path.join(out, "full", "epoch=0-step=3.ckpt")
    report["full_ckpt"] = full
    report["resumed_full"] = trainer_run("xla_fsdp_v2", 2, out, "r1", ckpt_path=full)[0]

    sharded = XLAFSDPv2Strategy(state_dict_type="sharded")
    report["sharded_first"] = trainer_run(sharded, 1, out, "sharded", every_epoch=True)[0]
    path = os.path.join(out, "sharded", "epoch=0-step=3.ckpt")
    report["sharded_ckpt"] = sorted(os.listdir(path))
    resumed = XLAFSDPv2Strategy(state_dict_type="sharded")
    report["resumed_sharded"] = trainer_run(resumed, 2, out, "r2", ckpt_path=path)[0]

    for precision in ("bf16-true", "16-true"):
        report[precision] = trainer_run("xla_fsdp_v2", 1, out, precision, precision=precision)[0]
    report["mesh_2d"] = trainer_run(XLAFSDPv2Strategy(mesh_shape=(2, DEVICES // 2)), 1, out, "2d")[0]
    try:
        trainer_run(XLAFSDPv2Strategy(mesh_shape=(DEVICES - 1,)), 1, out, "bad")
    except ValueError as error:
        report["bad_mesh"] = str(error)
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", choices=["trainer", "fabric"], required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.api == "trainer":
        report = trainer_scenarios(args.out)
    else:
        from fsdp_v2_fabric import fabric_scenarios

        report = fabric_scenarios(args.out)
    with open(os.path.join(args.out, "report.json"), "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    main()

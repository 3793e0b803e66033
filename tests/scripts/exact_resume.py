"""One run of the exact-continuation tests (tests/test_exact_resume.py): a fit that may stop itself and may resume.

    python exact_resume.py ROOT --strategy single_xla [--stop KIND[:ARGS]] [--resume] [--signal-to main]

A seeded fit (``seed_everything(1234)``) of a small model with dropout, SGD with momentum, a step
LR scheduler, ``accumulate_grad_batches=2``, a shuffled training loader of indexed samples and a
validation loader, on ``--strategy`` (4 devices unless ``single_xla``; ``xla`` through
tests/xla_cpu_harness.py when ``HARNESS`` names its folder; ``torchtpu`` and ``torchtpu_ddp``: the
TorchTPU plugin's strategies on ``accelerator="tpu"``, one device or two DDP processes through
Lightning's launcher, on the stand-in device). Under ``ROOT``:

* ``seen.jsonl``: one line per training batch, appended by every run, when rank 0 (for ``xla``
  every rank) starts it: epoch, batch index, rank and the sample indices of the batch;
* ``validated.jsonl``: one line per validation run that ended (not the sanity check's), appended
  by every run: the epoch and the logged ``val_loss`` (global rank 0's);
* ``weights.pt``: the module's state dict when training ends (written by global rank 0);
* ``checkpoints/last-stopped.ckpt``: the stop checkpoint, when a stop signal ended the run.

``--stop`` sends SIGTERM to this process (``--signal-to main``: to the spawn strategy's main
process) from global rank 0, once: ``batch:N`` in ``training_step`` of the fit's batch number N
(from 0, across epochs), ``first`` in the first ``training_step`` this process runs (before its
first step's graph is compiled), ``val:E:J`` in ``validation_step`` of batch J of epoch E's
validation, ``sanity`` in the sanity check's first batch. ``--resume`` fits with ``ckpt_path="last"``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

if os.environ.get("HARNESS"):  # the spawn strategy on PJRT CPU: real collectives between replica threads
    sys.path.insert(0, os.environ["HARNESS"])
    import xla_cpu_harness

    xla_cpu_harness.install()

import lightning as L
import torch
from indexed_samples import Indexed, regressor
from torch.utils.data import DataLoader

BATCH, TRAIN_BATCHES, VAL_BATCHES, EPOCHS, ACCUMULATE = 4, 8, 4, 3, 2

parser = argparse.ArgumentParser()
parser.add_argument("root")
parser.add_argument("--strategy", default="single_xla")
parser.add_argument("--stop", default="")
parser.add_argument("--resume", action="store_true")
parser.add_argument("--signal-to", default="this process", choices=["this process", "main"])
args = parser.parse_args()
DEVICES = {"single_xla": 1, "torchtpu": 1, "torchtpu_ddp": 2}.get(args.strategy, 4)
ACCELERATOR, STRATEGY = ("tpu", "auto") if args.strategy.startswith("torchtpu") else ("xla", args.strategy)
KIND, _, WHERE = args.stop.partition(":")
SEEN = os.path.join(args.root, "seen.jsonl")


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = regressor(0.5)
        self.stopped = False
        self.trained_here = 0

    def stop_now(self) -> None:
        if not self.stopped and self.global_rank == 0:
            self.stopped = True
            os.kill(os.getppid() if args.signal_to == "main" else os.getpid(), signal.SIGTERM)

    def on_train_batch_start(self, batch, batch_idx):
        if self.global_rank == 0 or args.strategy == "xla":
            record = {"epoch": self.current_epoch, "batch": batch_idx, "rank": self.global_rank}
            record["indices"] = batch[2].cpu().tolist()
            with open(SEEN, "a") as stream:
                stream.write(json.dumps(record) + "\n")

    def training_step(self, batch, batch_idx):
        if KIND == "first" and self.trained_here == 0:
            self.stop_now()
        if KIND == "batch" and self.trainer.fit_loop.epoch_loop.total_batch_idx == int(WHERE):
            self.stop_now()
        self.trained_here += 1
        x, y, _ = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        if KIND == "sanity" and self.trainer.sanity_checking:
            self.stop_now()
        if KIND == "val" and not self.trainer.sanity_checking:
            epoch, index = (int(part) for part in WHERE.split(":"))
            if self.current_epoch == epoch and batch_idx == index:
                self.stop_now()
        x, y, _ = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def on_validation_epoch_end(self):
        if self.global_rank == 0 and not self.trainer.sanity_checking:
            record = {"epoch": self.current_epoch, "val_loss": self.trainer.callback_metrics["val_loss"].item()}
            with open(os.path.join(args.root, "validated.jsonl"), "a") as stream:
                stream.write(json.dumps(record) + "\n")

    def on_train_end(self):
        if self.global_rank == 0:
            weights = {name: tensor.detach().cpu().clone() for name, tensor in self.state_dict().items()}
            torch.save(weights, os.path.join(args.root, "weights.pt"))
            print("FINAL_GLOBAL_STEP", self.global_step, flush=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


L.seed_everything(1234, verbose=False)
model = Model()
samples = TRAIN_BATCHES * BATCH * DEVICES
train = DataLoader(Indexed(samples, 0), batch_size=BATCH, shuffle=True)
val = DataLoader(Indexed(VAL_BATCHES * BATCH * DEVICES, 10_000), batch_size=BATCH)
trainer = L.Trainer(
    accelerator=ACCELERATOR,
    strategy=STRATEGY,
    devices="auto" if DEVICES > 1 else 1,
    max_epochs=EPOCHS,
    accumulate_grad_batches=ACCUMULATE,
    default_root_dir=args.root,
    enable_progress_bar=False,
    enable_model_summary=False,
    logger=False,
    enable_checkpointing=False,
)
trainer.fit(model, train, val, ckpt_path="last" if args.resume else None)

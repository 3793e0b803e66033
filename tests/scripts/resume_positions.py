"""Resumes from every position class, many fits in one process (tests/test_exact_resume.py).

    python resume_positions.py ROOT --strategy single_xla [--loaders one|two] [--cases a,b,...] [--plain]

(``--plain`` with ``--loaders two`` also leaves out the dropout; see below.)

A seeded fit (``seed_everything(1234)``) of a small model with dropout, SGD with momentum and a step
LR scheduler, 3 epochs of 8 training batches of a shuffled loader (``--loaders two``: a
``CombinedLoader`` in ``max_size_cycle`` mode of that loader and a shuffled one of 3 batches, so
the shorter one starts over within each epoch) and a validation loader, on ``--strategy`` (4
devices unless ``single_xla``; ``xla`` through tests/xla_cpu_harness.py when ``HARNESS`` names its
folder). The uninterrupted fit runs first and writes, with ``trainer.save_checkpoint``, one
checkpoint per position class of epoch 0 (epoch 1 for ``mid1``):

* ``mid``: ``on_train_batch_end`` of batch 2 (mid-epoch; ``mid1``: of batch 4 of epoch 1);
* ``last``: ``on_train_batch_end`` of batch 7, the epoch's last, before its validation;
* ``val``: ``on_validation_end`` of the epoch-end validation;
* ``next``: ``on_train_epoch_end``, after the validation, before the next epoch's first batch.

Then each case of ``--cases`` resumes, in a fresh Trainer and model: ``ckpt:P`` from checkpoint P,
``stop:P`` from the stop checkpoint of a fit stopped by SIGTERM sent to this process at position P
(``last``: in ``training_step`` of batch 7; ``val``: in ``on_validation_end``; ``next``: in
``on_train_epoch_end``), with ``ckpt_path="last"``. For each case one line
``CASE <name> <json>`` holds ``batches`` (the sample indices each training batch of the resumed fit
had, on global rank 0; for ``stop:P``, of the stopped fit and the resumed one), ``steps`` (the
final global step), ``validations`` (the epochs validated) and ``same_weights`` (whether the final
weights equal the uninterrupted fit's bit for bit); the
uninterrupted fit's line is ``CASE uninterrupted``. ``--plain``: also on CPU with plain Lightning
(``accelerator="cpu"``), lines ``PLAIN <name> <json>`` with the same fields (no weights check:
another device); with ``--loaders two`` the model has then no dropout (on CPU it draws from the
host generator the loaders' shuffles come from, on XLA from the device's), so the orders compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys

if os.environ.get("HARNESS"):  # the spawn strategy on PJRT CPU: real collectives between replica threads
    sys.path.insert(0, os.environ["HARNESS"])
    import xla_cpu_harness

    xla_cpu_harness.install()

import lightning as L
import torch
from indexed_samples import Indexed, regressor
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import DataLoader

BATCH, TRAIN_BATCHES, SHORT_BATCHES, VAL_BATCHES, EPOCHS = 4, 8, 3, 2, 3

parser = argparse.ArgumentParser()
parser.add_argument("root")
parser.add_argument("--strategy", default="single_xla")
parser.add_argument("--loaders", default="one", choices=["one", "two"])
parser.add_argument("--cases", default="ckpt:mid,ckpt:last,ckpt:val,ckpt:next")
parser.add_argument("--plain", action="store_true")
args = parser.parse_args()
DEVICES = 1 if args.strategy == "single_xla" else 4
EVENTS = os.path.join(args.root, "events.jsonl")  # of the fit under way (the spawn strategy's workers write too)


def event(kind: str, value) -> None:
    """Note a training batch's sample indices, a validation's epoch or the final step (global rank 0's)."""
    with open(EVENTS, "a") as stream:
        stream.write(json.dumps([kind, value]) + "\n")


# dropout draws from torch's CPU generator on CPU (the device's on XLA): none where plain Lightning is compared
DROPOUT = 0.0 if args.plain and args.loaders == "two" else 0.5


class Model(L.LightningModule):
    def __init__(self, saves: dict, stop: str) -> None:
        super().__init__()
        self.net = regressor(DROPOUT)
        self.saves, self.stop = saves, stop  # position -> checkpoint path; the position to stop at

    def _at(self, position: str) -> None:
        if self.current_epoch != (1 if position == "mid1" else 0):
            return
        if position in self.saves:
            self.trainer.save_checkpoint(self.saves[position])
        if position == self.stop and self.global_rank == 0:
            self.stop = ""
            os.kill(os.getpid(), signal.SIGTERM)

    def training_step(self, batch, batch_idx):
        parts = batch if args.loaders == "two" else [batch]
        if self.global_rank == 0:
            event("batch", [part[2].cpu().tolist() for part in parts])
        if batch_idx == TRAIN_BATCHES - 1 and self.stop == "last":
            self._at("last")
        loss = sum(torch.nn.functional.mse_loss(self.net(x), y) for x, y, _ in parts)
        self.log("loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx == 2:  # with two loaders: the shorter one's first pass has just ended
            self._at("mid")
        if batch_idx == 4:  # with two loaders: inside the shorter one's second pass
            self._at("mid1")
        if batch_idx == TRAIN_BATCHES - 1 and "last" in self.saves:
            self._at("last")

    def on_train_end(self):
        if self.global_rank == 0:
            event("steps", self.global_step)

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def on_validation_end(self):
        if not self.trainer.sanity_checking:
            if self.global_rank == 0:
                event("validated", self.current_epoch)
            self._at("val")

    def on_train_epoch_end(self):
        self._at("next")

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def loaders():
    samples = BATCH * DEVICES
    train = DataLoader(Indexed(TRAIN_BATCHES * samples, 0), batch_size=BATCH, shuffle=True)
    if args.loaders == "two":
        short = DataLoader(Indexed(SHORT_BATCHES * samples, 1000), batch_size=BATCH, shuffle=True)
        train = CombinedLoader([train, short], "max_size_cycle")
    return train, DataLoader(Indexed(VAL_BATCHES * samples, 10_000), batch_size=BATCH)


def fit(root: str, plain: bool, saves: dict, stop: str = "", ckpt_path=None) -> Model:
    L.seed_everything(1234, verbose=False)
    os.makedirs(args.root, exist_ok=True)
    open(EVENTS, "w").close()
    model = Model(saves, stop)
    train, val = loaders()
    device = {"accelerator": "cpu", "devices": 1} if plain else {"accelerator": "xla", "strategy": args.strategy}
    if not plain:
        device["devices"] = "auto" if DEVICES > 1 else 1
    trainer = L.Trainer(
        **device,
        max_epochs=EPOCHS,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    try:
        trainer.fit(model, train, val, ckpt_path=ckpt_path)
    except SystemExit as stopped:
        assert stopped.code == 143, stopped.code
    with open(EVENTS) as stream:
        events = [json.loads(line) for line in stream]
    os.remove(EVENTS)
    model.batches = [value for kind, value in events if kind == "batch"]
    model.validations = [value for kind, value in events if kind == "validated"]
    model.steps = next((value for kind, value in events if kind == "steps"), None)
    return model


def weights(model: Model) -> dict:
    return {name: tensor.detach().cpu().clone() for name, tensor in model.state_dict().items()}


def report(tag: str, name: str, model: Model, reference=None) -> None:
    record = {"batches": model.batches, "steps": model.steps, "validations": model.validations}
    if reference is not None:
        expected = weights(reference)
        record["same_weights"] = all(torch.equal(t, expected[n]) for n, t in weights(model).items())
    print(tag, name, json.dumps(record), flush=True)


def run(plain: bool) -> None:
    tag = "PLAIN" if plain else "CASE"
    base = os.path.join(args.root, tag.lower())
    cases = args.cases.split(",")
    saves = {c.split(":")[1]: os.path.join(base, "saved", c.split(":")[1] + ".ckpt") for c in cases if "ckpt:" in c}
    reference = fit(os.path.join(base, "uninterrupted"), plain, saves)
    report(tag, "uninterrupted", reference)
    for case in cases:
        kind, position = case.split(":")
        root = os.path.join(base, case.replace(":", "-"))
        if kind == "ckpt":
            resumed = fit(root, plain, {}, ckpt_path=saves[position])
        elif plain:
            continue  # plain Lightning writes no stop checkpoint
        else:
            stopped = fit(root, plain, {}, stop=position)
            resumed = fit(root, plain, {}, ckpt_path="last")
            resumed.batches = stopped.batches + resumed.batches  # the whole fit's
        report(tag, case, resumed, None if plain else reference)
        shutil.rmtree(root, ignore_errors=True)


run(plain=False)
if args.plain:
    run(plain=True)

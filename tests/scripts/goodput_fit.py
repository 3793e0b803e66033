"""A fit whose time in each goodput bucket has a known lower bound, for tests/test_goodput.py.

    python goodput_fit.py ROOT     (settings from the environment, below)

The module sleeps where each bucket's time is spent (a sleep of s seconds takes at least s):
``FETCH_SLEEP`` in the loader's collate function (data waiting: training batches; validation
batches count as validation), ``STEP_SLEEP`` in ``training_step`` (productive), ``VAL_SLEEP`` in
``validation_step`` (validation), ``SAVE_SLEEP`` in ``on_save_checkpoint`` (checkpoint save),
``LOAD_SLEEP`` in ``on_load_checkpoint`` (checkpoint restore) and ``SETUP_SLEEP`` before ``fit``
(start-up). It counts each call, where its bucket's sleeps happened, in ``ROOT/counts-<pid>.json``
(rewritten after each call, so a killed run leaves its counts; with replica threads, ``fetch`` and
``save`` count every replica's, ``step`` and ``val`` rank 0's). ``STOP_AT`` / ``KILL_AT``: the
process sends itself SIGTERM / SIGKILL inside the ``training_step`` of that global step.
``EVERY_N``: ``ModelCheckpoint(every_n_train_steps=EVERY_N, save_last=True)`` (else Lightning's
default ``ModelCheckpoint``). ``CKPT_PATH``: ``fit(ckpt_path=...)``. A logger of its own appends
what ``log_metrics`` receives to ``ROOT/logged.jsonl``. After ``fit`` it prints one JSON line:
the Unix times of its first line and around ``fit``, torch_xla's compile seconds, the global step.
"""

from __future__ import annotations

import time

FIRST_LINE = time.time()

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

if os.environ.get("HARNESS"):  # the spawn strategy on PJRT CPU: real collectives between replica threads
    sys.path.insert(0, os.environ["HARNESS"])
    import xla_cpu_harness

    xla_cpu_harness.install()

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import Logger  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset, default_collate  # noqa: E402

ROOT = sys.argv[1]
SLEEPS = {
    name: float(os.environ.get(f"{name.upper()}_SLEEP", "0")) for name in ("fetch", "step", "val", "save", "load")
}
STOP_AT, KILL_AT = int(os.environ.get("STOP_AT", "-1")), int(os.environ.get("KILL_AT", "-1"))
EPOCHS, BATCHES = int(os.environ.get("EPOCHS", "2")), 8
counts = {name: 0 for name in SLEEPS}


def counted(name: str) -> None:
    """One call of the sleeping place ``name``: sleep, count, write the counts."""
    time.sleep(SLEEPS[name])
    counts[name] += 1
    path = os.path.join(ROOT, f"counts-{os.getpid()}.json")
    partial = f"{path}.{threading.get_ident()}.tmp"  # replica threads (and their loader threads) of one process
    with open(partial, "w") as stream:
        json.dump(counts, stream)
    os.replace(partial, path)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        if self.global_rank == 0:
            if self.global_step == STOP_AT:
                os.kill(os.getpid(), signal.SIGTERM)
            if self.global_step == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            counted("step")
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_train_start(self):
        if self.global_rank == 0:
            print("START_GLOBAL_STEP", self.global_step, flush=True)

    def validation_step(self, batch, batch_idx):
        if self.global_rank == 0:
            counted("val")
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def on_save_checkpoint(self, checkpoint):
        counted("save")

    def on_load_checkpoint(self, checkpoint):
        counted("load")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Recorder(Logger):
    """Appends every ``log_metrics`` call to ``ROOT/logged.jsonl``."""

    name, version = "recorder", 0

    def log_metrics(self, metrics, step=None):
        with open(os.path.join(ROOT, "logged.jsonl"), "a") as stream:
            stream.write(json.dumps({"step": step, "metrics": metrics}) + "\n")

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def training_collate(samples):
    counted("fetch")
    return default_collate(samples)


if __name__ == "__main__":
    os.makedirs(ROOT, exist_ok=True)
    torch.manual_seed(0)
    devices = int(os.environ.get("DEVICES", "1"))
    samples = BATCHES * 8 * devices
    data = TensorDataset(torch.randn(samples, 4), torch.randn(samples, 1))
    every_n = int(os.environ.get("EVERY_N", "0"))
    checkpoint = ModelCheckpoint(every_n_train_steps=every_n, save_last=True) if every_n else ModelCheckpoint()
    time.sleep(float(os.environ.get("SETUP_SLEEP", "0")))
    strategy = os.environ.get("STRATEGY", "single_xla")
    trainer = L.Trainer(
        accelerator="xla",
        strategy=strategy,
        devices="auto" if devices > 1 else 1,
        max_epochs=EPOCHS,
        default_root_dir=ROOT,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=Recorder(),
        callbacks=[checkpoint],
        num_sanity_val_steps=2,
    )
    train = DataLoader(data, batch_size=8, collate_fn=training_collate)
    val = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)
    before_fit = time.time()
    trainer.fit(Model(), train, val, ckpt_path=os.environ.get("CKPT_PATH") or None)
    after_fit = time.time()
    import torch_xla.debug.metrics as met

    compile_time = met.metric_data("CompileTime")
    report = {
        "first_line": FIRST_LINE,
        "before_fit": before_fit,
        "after_fit": after_fit,
        "compile_s": compile_time[1] / 1e9 if compile_time else 0.0,
        "global_step": trainer.global_step,
    }
    print(json.dumps(report), flush=True)

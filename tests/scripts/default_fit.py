"""A Lightning script left at its defaults, fitted on XLA, for tests/test_metric_reads.py.

    python default_fit.py --strategy single_xla|xla_spmd [--own-callbacks] [--clip-accumulate]

Trainer defaults (progress bar, logger, ``ModelCheckpoint``, model summary), validation every
epoch and ``self.log(..., prog_bar=True)`` on every step and epoch. Prints one JSON line: per
epoch, torch_xla's compilation and device-to-host transfer counts (from the start of the epoch's
training to the start of the next one's, the last until the end of ``fit``), the step count, what
the module computed itself (the exact epoch-end values), and, with ``--own-callbacks``, what a
progress bar and a logger of the user's own received at each epoch end.
"""

from __future__ import annotations

import argparse
import json
import sys

import lightning as L
import torch
import torch_xla
import torch_xla.debug.metrics as met
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import Logger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS = 3
BATCH = 16
TRAIN_BATCHES = 16
VAL_BATCHES = 4


def counts() -> dict[str, int]:
    def count(name: str) -> int:
        data = met.metric_data(name)
        return int(data[0]) if data else 0

    return {"compiles": count("CompileTime"), "transfers": count("TransferFromDeviceTime")}


class Classifier(L.LightningModule):
    """Logs its loss on step and epoch (progress bar) and its validation loss; keeps its own copies."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        self.train_losses: list[torch.Tensor] = []
        self.val_losses: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True)
        self.train_losses.append(loss.detach())
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("val_loss", loss, prog_bar=True)
        if not self.trainer.sanity_checking:
            self.val_losses.append(loss.detach())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Meter(L.Callback):
    """torch_xla's counters per epoch, and the module's own exact epoch values."""

    def __init__(self) -> None:
        self.marks: list[dict[str, int]] = []
        self.steps: list[int] = []
        self.exact: list[dict[str, list[torch.Tensor]]] = []

    def on_train_epoch_start(self, trainer, pl_module):
        self.marks.append(counts())
        self.steps.append(trainer.global_step)

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        # the module's own record of what it logged; no tensor operation here, which would join the next graph
        self.exact.append({"train": pl_module.train_losses, "val": pl_module.val_losses})
        pl_module.train_losses, pl_module.val_losses = [], []


def exact_values(train: list[torch.Tensor], val: list[torch.Tensor]) -> dict[str, float]:
    """What Lightning should show at an epoch's end, from the module's own losses (equal batch sizes)."""
    train_cpu = [float(loss.cpu()) for loss in train]
    val_cpu = [float(loss.cpu()) for loss in val]
    return {
        "train_loss_step": train_cpu[-1],
        "train_loss_epoch": sum(train_cpu) / len(train_cpu),
        "val_loss": sum(val_cpu) / len(val_cpu),
    }


class OwnProgressBar(TQDMProgressBar):
    """A user's progress bar: records the metrics it gets at each epoch end."""

    def __init__(self) -> None:
        super().__init__()
        self.at_epoch_end: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer, pl_module):
        super().on_train_epoch_end(trainer, pl_module)
        self.at_epoch_end.append(dict(self.get_metrics(trainer, pl_module)))


class OwnLogger(Logger):
    """A user's logger: records every call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "own"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics, step=None):
        self.calls.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--own-callbacks", action="store_true")
    parser.add_argument("--clip-accumulate", action="store_true")
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    samples = BATCH * TRAIN_BATCHES
    data = TensorDataset(
        torch.randn(samples, 8, generator=generator), torch.randint(0, 4, (samples,), generator=generator)
    )
    val = TensorDataset(data.tensors[0][: BATCH * VAL_BATCHES], data.tensors[1][: BATCH * VAL_BATCHES])
    meter = Meter()
    callbacks: list[L.Callback] = [meter]
    flags: dict[str, object] = {}
    if args.own_callbacks:
        bar, logger = OwnProgressBar(), OwnLogger()
        callbacks.append(bar)
        flags["logger"] = logger
    if args.clip_accumulate:
        flags.update(gradient_clip_val=0.5, accumulate_grad_batches=2)
    torch.manual_seed(0)
    trainer = L.Trainer(
        accelerator="tpu",
        devices="auto",
        strategy=args.strategy,
        max_epochs=EPOCHS,
        callbacks=callbacks,
        default_root_dir=args.root,
        **flags,
    )
    model = Classifier()
    trainer.fit(model, DataLoader(data, batch_size=BATCH, shuffle=True), DataLoader(val, batch_size=BATCH))
    torch_xla.sync(wait=True)
    end = counts()
    marks = [*meter.marks, end]
    report = {
        "epochs": [
            {key: marks[i + 1][key] - marks[i][key] for key in end} | {"batches": TRAIN_BATCHES}
            for i in range(len(meter.marks))
        ],
        "exact": [exact_values(epoch["train"], epoch["val"]) for epoch in meter.exact],
        "progress_bar_metrics": {k: float(v) for k, v in trainer.progress_bar_metrics.items()},
        "checkpoints": sorted(str(path) for path in trainer.checkpoint_callback.best_k_models)
        if trainer.checkpoint_callback
        else [],
        "progress_bar_type": type(trainer.progress_bar_callback).__name__,
        "loggers": [type(logger).__name__ for logger in trainer.loggers],
    }
    if args.own_callbacks:
        report["own_progress_bar"] = bar.at_epoch_end
        report["own_logger"] = logger.calls
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())

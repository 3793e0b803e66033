"""The main job: train a digit classifier with a plain ``lightning.Trainer`` on XLA.

Nothing here imports trainer-plugins or xla-plugins: once ``xla-plugins`` is installed,
``Trainer(accelerator="tpu")`` runs through it. The data is scikit-learn's bundled 8x8 digits set
(1,797 images, no download), split into training, validation and test sets. The script trains with
Lightning's progress bar (showing the training loss), prints the validation accuracy after each
epoch, evaluates on the test split, saves a checkpoint, reloads it into a fresh model, checks that
the reloaded model scores the same, and writes next to the checkpoint (``--out-dir``):

* ``digits.ckpt``: the checkpoint;
* ``metrics.csv``: per epoch, ``epoch,train_loss,val_loss,val_accuracy``;
* ``learning_curve.png``: loss and accuracy per epoch (needs matplotlib; skipped with a note without it).

Its last line on stdout is the summary::

    test_accuracy=<float> steps_per_s=<float> device=<PJRT device> precision=<precision>

It exits with status 1 if the accuracy is below ``--min-accuracy`` or the reloaded model differs.
Run it as a script: XLA multi-device launching needs the ``if __name__ == "__main__"`` guard.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: Columns of metrics.csv, one row per epoch.
METRICS = ("epoch", "train_loss", "val_loss", "val_accuracy")


def say(*parts: object) -> None:
    """Print to stdout at once, after anything pending on stderr (keeps the order in a captured log)."""
    sys.stderr.flush()
    print(*parts, flush=True)


class DigitsClassifier(L.LightningModule):
    """A two-layer perceptron over the 64 pixels of an 8x8 digit."""

    def __init__(self, hidden: int = 128, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), batch_size=len(y))
        self.log("val_accuracy", (logits.argmax(dim=-1) == y).float().mean(), prog_bar=True, batch_size=len(y))

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        accuracy = (self(x).argmax(dim=-1) == y).float().mean()
        self.log("test_accuracy", accuracy, batch_size=len(y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class StepRate(Callback):
    """Training steps per second after the first epoch (which includes XLA's graph compilation)."""

    def __init__(self) -> None:
        self.steps = 0
        self.started: float | None = None
        self.elapsed = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch >= 1:
            self.started = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if self.started is not None:
            self.steps += 1

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.started is not None:
            self.elapsed += time.perf_counter() - self.started
            self.started = None

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed if self.elapsed else float("nan")


class LearningCurve(Callback):
    """Per epoch: the mean training loss, the validation loss and accuracy; printed as each epoch ends."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning runs validation inside the training epoch: both sets of metrics are here now.
        metrics = trainer.callback_metrics
        row = {
            "epoch": trainer.current_epoch + 1,
            "train_loss": float(metrics["train_loss_epoch"]),
            "val_loss": float(metrics["val_loss"]),
            "val_accuracy": float(metrics["val_accuracy"]),
        }
        self.rows.append(row)
        pl_module.print(  # above the progress bar, on stdout
            f"epoch {row['epoch']}/{trainer.max_epochs}: train_loss={row['train_loss']:.4f}"
            f" val_loss={row['val_loss']:.4f} val_accuracy={row['val_accuracy']:.4f}"
        )
        sys.stdout.flush()

    def write_csv(self, path: str) -> None:
        with open(path, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=METRICS)
            writer.writeheader()
            writer.writerows(self.rows)

    def write_png(self, path: str) -> bool:
        """Draw loss and accuracy per epoch; ``False`` (nothing written) when matplotlib is missing."""
        try:
            from matplotlib.figure import Figure
            from matplotlib.ticker import MaxNLocator
        except ImportError:
            return False
        epochs = [row["epoch"] for row in self.rows]
        figure = Figure(figsize=(9, 3.5), layout="constrained")
        loss, accuracy = figure.subplots(1, 2)
        loss.plot(epochs, [row["train_loss"] for row in self.rows], marker="o", label="training")
        loss.plot(epochs, [row["val_loss"] for row in self.rows], marker="o", label="validation")
        loss.set(xlabel="epoch", ylabel="cross-entropy loss", title="loss")
        loss.legend()
        accuracy.plot(epochs, [row["val_accuracy"] for row in self.rows], marker="o", color="tab:green")
        accuracy.set(xlabel="epoch", ylabel="accuracy", title="validation accuracy", ylim=(0, 1))
        for axes in (loss, accuracy):
            axes.grid(alpha=0.3)
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        figure.savefig(path, dpi=100)
        return True


def digits_loaders(batch_size: int, seed: int) -> tuple[DataLoader, DataLoader, DataLoader]:
    """Train/validation/test loaders: a stratified 80/20 train/test split, 15% of train held out for
    validation; features standardised on the training part."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=0.2, random_state=seed, stratify=digits.target
    )
    x_train, x_val, y_train, y_val = train_test_split(
        x_train, y_train, test_size=0.15, random_state=seed, stratify=y_train
    )
    scaler = StandardScaler().fit(x_train)

    def dataset(x: Any, y: Any) -> TensorDataset:
        return TensorDataset(torch.tensor(scaler.transform(x), dtype=torch.float32), torch.tensor(y))

    train = DataLoader(dataset(x_train, y_train), batch_size=batch_size, shuffle=True, drop_last=True)
    val = DataLoader(dataset(x_val, y_val), batch_size=batch_size)
    test = DataLoader(dataset(x_test, y_test), batch_size=batch_size)
    return train, val, test


def reload(path: str) -> DigitsClassifier:
    """A fresh model from the checkpoint (``weights_only``: tensors and plain data only)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    model = DigitsClassifier(**checkpoint["hyper_parameters"])
    model.load_state_dict(checkpoint["state_dict"])
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="tpu", help="Trainer(accelerator=...) (default: %(default)s)")
    parser.add_argument("--devices", default="1", help="Trainer(devices=...) (default: %(default)s)")
    parser.add_argument("--precision", default="bf16-true", help="Trainer(precision=...) (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=12, help="training epochs (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and the model (default: %(default)s)")
    parser.add_argument(
        "--min-accuracy", type=float, default=0.90, help="exit with status 1 below this (default: %(default)s)"
    )
    parser.add_argument(
        "--out-dir",
        "--checkpoint-dir",
        default="demo-output",
        help="where digits.ckpt, metrics.csv and learning_curve.png go (default: %(default)s)",
    )
    args = parser.parse_args(argv)

    L.seed_everything(args.seed, verbose=False)
    train_loader, val_loader, test_loader = digits_loaders(args.batch_size, args.seed)
    os.makedirs(args.out_dir, exist_ok=True)

    rate, curve = StepRate(), LearningCurve()
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        precision=args.precision,
        max_epochs=args.epochs,
        callbacks=[rate, curve],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    model = DigitsClassifier()
    trainer.fit(model, train_dataloaders=train_loader, val_dataloaders=val_loader)
    accuracy = trainer.test(model, dataloaders=test_loader, verbose=False)[0]["test_accuracy"]

    checkpoint = os.path.join(args.out_dir, "digits.ckpt")
    trainer.save_checkpoint(checkpoint, weights_only=False)  # the full training state
    reloaded_accuracy = trainer.test(reload(checkpoint), dataloaders=test_loader, verbose=False)[0]["test_accuracy"]
    written = [checkpoint, os.path.join(args.out_dir, "metrics.csv")]
    curve.write_csv(written[1])
    picture = os.path.join(args.out_dir, "learning_curve.png")
    if curve.write_png(picture):
        written.append(picture)
    else:
        say("matplotlib is not installed: no learning_curve.png (pip install matplotlib)")
    say(f"checkpoint reloaded: test_accuracy={reloaded_accuracy:.4f} (trained model: {accuracy:.4f})")
    say("wrote", ", ".join(written))

    import torch_xla.runtime as xr

    device = xr.device_type()
    say(f"test_accuracy={accuracy:.4f} steps_per_s={rate.steps_per_s:.1f} device={device} precision={args.precision}")
    if abs(reloaded_accuracy - accuracy) > 1e-6:
        print("error: the reloaded model does not score like the trained one", file=sys.stderr)
        return 1
    if accuracy < args.min_accuracy:
        print(f"error: accuracy {accuracy:.4f} is below {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

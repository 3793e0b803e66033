"""The main job: train a digit classifier with a plain ``lightning.Trainer`` on XLA.

Nothing here imports trainer-plugins or xla-plugins: once ``xla-plugins`` is installed,
``Trainer(accelerator="tpu")`` runs through it. The data is scikit-learn's bundled 8x8 digits set
(1,797 images, no download). The script trains, evaluates on a held-out split, saves a checkpoint,
reloads it into a fresh model and Trainer, checks that the reloaded model scores the same, and ends
with one summary line::

    test_accuracy=<float> steps_per_s=<float> device=<PJRT device> precision=<precision>

It exits with status 1 if the accuracy is below ``--min-accuracy`` or the reloaded model differs.
Run it as a script: XLA multi-device launching needs the ``if __name__ == "__main__"`` guard.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


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
        self.log("train_loss", loss)
        return loss

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


def digits_loaders(batch_size: int, seed: int) -> tuple[DataLoader, DataLoader]:
    """Train/test loaders over a stratified 80/20 split, features standardised on the train split."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=0.2, random_state=seed, stratify=digits.target
    )
    scaler = StandardScaler().fit(x_train)

    def dataset(x: object, y: object) -> TensorDataset:
        return TensorDataset(torch.tensor(scaler.transform(x), dtype=torch.float32), torch.tensor(y))

    train = DataLoader(dataset(x_train, y_train), batch_size=batch_size, shuffle=True, drop_last=True)
    test = DataLoader(dataset(x_test, y_test), batch_size=batch_size)
    return train, test


def make_trainer(args: argparse.Namespace, **kwargs: object) -> L.Trainer:
    return L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        precision=args.precision,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="tpu")
    parser.add_argument("--devices", default="1")
    parser.add_argument("--precision", default="bf16-true")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-accuracy", type=float, default=0.90)
    parser.add_argument("--checkpoint-dir", help="where to keep the checkpoint (default: a temporary directory)")
    args = parser.parse_args(argv)

    if not os.environ.get("PJRT_DEVICE"):
        print("PJRT_DEVICE is not set: torch_xla uses a TPU if one is attached, otherwise its CPU device.")
    L.seed_everything(args.seed, verbose=False)
    train_loader, test_loader = digits_loaders(args.batch_size, args.seed)

    rate = StepRate()
    trainer = make_trainer(args, max_epochs=args.epochs, callbacks=[rate], enable_checkpointing=False)
    model = DigitsClassifier()
    trainer.fit(model, train_dataloaders=train_loader)
    accuracy = trainer.test(model, dataloaders=test_loader, verbose=False)[0]["test_accuracy"]

    import torch_xla.runtime as xr

    device = xr.device_type()
    print(
        f"trained on {trainer.strategy.root_device} (PJRT_DEVICE={device}) with {type(trainer.accelerator).__module__}"
    )
    if device == "CPU":
        print("No TPU in use: this run used torch_xla's PJRT CPU device.")

    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(args.checkpoint_dir or scratch, "digits.ckpt")
        trainer.save_checkpoint(path)
        reloaded = DigitsClassifier.load_from_checkpoint(path)
        reloaded_accuracy = make_trainer(args).test(reloaded, dataloaders=test_loader, verbose=False)[0][
            "test_accuracy"
        ]
    print(f"checkpoint reloaded: test_accuracy={reloaded_accuracy:.4f} (trained model: {accuracy:.4f})")

    print(f"test_accuracy={accuracy:.4f} steps_per_s={rate.steps_per_s:.1f} device={device} precision={args.precision}")
    if abs(reloaded_accuracy - accuracy) > 1e-6:
        print("error: the reloaded model does not score like the trained one", file=sys.stderr)
        return 1
    if accuracy < args.min_accuracy:
        print(f"error: accuracy {accuracy:.4f} is below {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A small sequence model fitted on XLA with one trigger of late compilation or host read, for
tests/test_compile_monitor.py.

    python compile_monitor_fit.py --trigger none|padding|item|item-padding|callback-print|branch|partial-validation
        [--strategy S] [--recompiles B]

On several devices (``xla_spmd``, ``xla_fsdp_v2``, and ``xla``, the spawn strategy, whose workers
run one replica thread per device on PJRT CPU through tests/xla_cpu_harness.py) the data grow with
the device count, so every strategy trains the same number of steps on per-device batches of 1.
With ``xla`` the JSON line comes from the main process, which holds no monitor: the workers'
reports (Python's warnings, each text once) and summary are in their output (stderr).

``padding``: a collate function pads each batch to its longest sequence, and the second epoch has
longer sequences than the first (new shapes after the warm-up). ``item``: ``if loss.item() > 100:``
in ``training_step``. ``item-padding``: both in one training step. ``callback-print``: a callback prints
the loss in ``on_train_batch_end``.
``branch``: ``training_step`` doubles the loss at step 12 only. ``partial-validation``: validation
batches of 2 from 5 items, so each validation run ends with a batch of 1 (expected: no report).
Validation runs every epoch, the loss is logged with ``prog_bar=True``, checkpoints are written.
Prints one JSON line: the monitor's reports and summary, torch_xla's counter deltas over ``fit``
(compilations, compile seconds, transfers) and the error raised, if any.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings

import lightning as L
import torch
from torch.utils.data import DataLoader

from xla_plugins.compilation.compile_monitor import CompileMonitor
from xla_plugins.compilation.loop_phases import read_counters
from xla_plugins.compilation.recompile_budget import LateCompilationWarning
from xla_plugins.roles.accelerator import XLAAccelerator

EPOCHS = 3
TRAIN_ITEMS = 8  # batch size 1: 8 steps an epoch
VAL_ITEMS = 4


class Model(L.LightningModule):
    def __init__(self, trigger: str) -> None:
        super().__init__()
        self.trigger = trigger
        self.embedding = torch.nn.Embedding(50, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(tokens).mean(1)).squeeze(-1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self(batch).pow(2).mean()
        if self.trigger in ("item", "item-padding"):
            if loss.item() > 100:
                print("large loss")
        if self.trigger == "branch" and self.global_step == 12:
            loss = loss * 2  # a Python value (the step number) changes the traced graph once
        self.log("loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val_loss", self(batch).pow(2).mean(), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Printer(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
        print(outputs["loss"])


class Sequences(torch.utils.data.Dataset):
    """Token sequences of length 5; with ``growing``, of length 5 + 2 x epoch (set by the model's epoch)."""

    def __init__(self, items: int, growing: bool) -> None:
        self.items, self.growing, self.epoch = items, growing, 0

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> torch.Tensor:
        length = 5 + (2 * self.epoch if self.growing and index % 2 else 0)
        return torch.randint(0, 50, (length,), generator=torch.Generator().manual_seed(index))


class EpochSetter(L.Callback):
    def __init__(self, dataset: Sequences) -> None:
        self.dataset = dataset

    def on_train_epoch_start(self, trainer, pl_module):  # noqa: ANN001
        self.dataset.epoch = trainer.current_epoch


def pad_to_longest(items: list[torch.Tensor]) -> torch.Tensor:
    longest = max(len(item) for item in items)
    return torch.stack([torch.nn.functional.pad(item, (0, longest - len(item))) for item in items])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--trigger",
        default="none",
        choices=("none", "padding", "item", "item-padding", "callback-print", "branch", "partial-validation"),
    )
    parser.add_argument("--strategy", default="single_xla")
    parser.add_argument("--recompiles", default=None)
    parser.add_argument("--root", default=".")
    args = parser.parse_args()

    L.seed_everything(0)
    # every strategy trains the same steps: one batch of 1 per device, TRAIN_ITEMS steps an epoch
    devices = 1 if args.strategy == "single_xla" else XLAAccelerator.auto_device_count()
    train = Sequences(TRAIN_ITEMS * devices, growing=args.trigger in ("padding", "item-padding"))
    callbacks: list[L.Callback] = [EpochSetter(train)]
    if args.trigger == "callback-print":
        callbacks.append(Printer())
    if args.strategy == "single_xla":
        from xla_plugins.strategies.single_xla import SingleDeviceXLAStrategy as Strategy
    elif args.strategy == "xla_fsdp_v2":
        from xla_plugins.strategies.xla_fsdp_v2 import XLAFSDPv2Strategy as Strategy
    elif args.strategy == "xla":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import xla_cpu_harness

        xla_cpu_harness.install()
        from xla_plugins.strategies.xla import XLAStrategy as Strategy
    else:
        from xla_plugins.strategies.xla_spmd import XLASPMDStrategy as Strategy
    strategy = Strategy(recompiles=args.recompiles) if args.recompiles else args.strategy
    trainer = L.Trainer(
        accelerator="tpu",
        devices="auto" if args.strategy != "single_xla" else 1,
        strategy=strategy,
        max_epochs=EPOCHS,
        default_root_dir=args.root,
        logger=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        callbacks=callbacks,
    )
    before = read_counters()
    error = None
    # the spawn strategy's workers would inherit the recording (a fork) and keep their reports to themselves
    recording = warnings.catch_warnings(record=True) if args.strategy != "xla" else contextlib.nullcontext([])
    with recording as caught:
        if args.strategy != "xla":
            warnings.simplefilter("always")
        try:
            trainer.fit(
                Model(args.trigger),
                DataLoader(train, batch_size=1, collate_fn=pad_to_longest),
                DataLoader(
                    Sequences(VAL_ITEMS * devices + (args.trigger == "partial-validation"), growing=False),
                    batch_size=2 if args.trigger == "partial-validation" else 1,
                    collate_fn=pad_to_longest,
                ),
            )
        except Exception as raised:  # noqa: BLE001  # the test checks which
            error = {"type": type(raised).__name__, "message": str(raised), "step": trainer.global_step}
    after = read_counters()
    monitors = [c for c in trainer.callbacks if isinstance(c, CompileMonitor)]
    print(
        json.dumps(
            {
                "warnings": [str(w.message) for w in caught if issubclass(w.category, LateCompilationWarning)],
                "warning_locations": [
                    f"{w.filename}:{w.lineno}" for w in caught if issubclass(w.category, LateCompilationWarning)
                ],
                "reports": monitors[0].reports if monitors else None,
                "summary": monitors[0].summary if monitors else None,
                "delta": [a - b for a, b in zip(after, before, strict=True)],
                "error": error,
                "item_is_torchs": torch.Tensor.item.__qualname__ == "TensorBase.item",
            }
        )
    )


if __name__ == "__main__":
    main()

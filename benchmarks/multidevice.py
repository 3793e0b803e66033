"""Multi-device throughput on N PJRT CPU devices, as JSON: the spawn strategy vs the SPMD strategy.

    python benchmarks/multidevice.py --strategy xla|xla_spmd --devices N

Both train the same model on the same global batch from the same loader (``batch / N`` per
device: spawn gives each replica a distributed sampler's shard, SPMD joins N loader batches and
shards them over the mesh) and report global samples
per second after the first epoch. On PJRT CPU the spawn strategy's collectives need the project's
test harness (tests/xla_cpu_harness.py, see docs/testing.md), which this script installs; its
figures therefore show the strategy's structure (threads, collectives), not TPU behaviour.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

GLOBAL_BATCH = 256
SAMPLES = 8192


class Module(L.LightningModule):
    """A compute-bound MLP that times its epochs after the first and reports from rank 0."""

    def __init__(self, report: str) -> None:
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
        )
        self.report = report
        self.started = 0.0
        self.samples = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.current_epoch >= 1:
            self.samples += GLOBAL_BATCH
        return nn.functional.cross_entropy(self.network(x), y)

    def on_train_epoch_start(self) -> None:
        if self.current_epoch == 1:
            self.started = time.perf_counter()

    def on_train_end(self) -> None:
        import torch_xla

        torch_xla.sync(wait=True)
        if self.global_rank == 0:
            Path(self.report).write_text(
                json.dumps({"samples_per_s": self.samples / (time.perf_counter() - self.started)})
            )

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=("xla", "xla_spmd"), required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    for name, value in {
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": str(args.devices),
        "XLA_THREAD_POOL_SIZE": str(2 * args.devices),
        "PJRT_CPU_ASYNC_CLIENT": "0",
    }.items():
        os.environ.setdefault(name, value)
    if args.strategy == "xla":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        import xla_cpu_harness

        xla_cpu_harness.install()

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(SAMPLES, 64, generator=generator)
    data = TensorDataset(inputs, torch.randint(0, 10, (SAMPLES,), generator=generator))
    per_loader = GLOBAL_BATCH // args.devices  # the loader's batch is per device for both strategies
    report = Path(tempfile.mkdtemp()) / "report.json"
    trainer = L.Trainer(
        accelerator="xla",
        devices=args.devices,
        strategy=args.strategy,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(str(report)), DataLoader(data, batch_size=per_loader, shuffle=True, drop_last=True))
    print(json.dumps({"strategy": args.strategy, "devices": args.devices, **json.loads(report.read_text())}))


if __name__ == "__main__":
    main()

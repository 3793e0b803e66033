"""A small BatchNorm model trained on the CPU (plain Lightning) and on XLA, for tests/test_batch_norm.py.

``run(api, accelerator, strategy, per_device_batch, devices)`` trains it with the Trainer
(``api="trainer"``) or Fabric (``"fabric"``) and returns the BatchNorm statistics, the trained
model's evaluation-mode predictions (on the CPU, after training) and whether BatchNorm hooks are
left on the modules. Run as a script (``--out``, with ``CPU_NUM_DEVICES`` devices) it writes
``<out>/report.json`` with the CPU reference and the ``xla_spmd`` and ``xla_fsdp_v2`` runs of both APIs;
with ``--spawn``, the Trainer on ``"xla"`` (tests/xla_cpu_harness.py) per rank and its CPU reference.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

GLOBAL_BATCH = 16
SAMPLES = 64


def net() -> nn.Sequential:
    """Two BatchNorm1d: affine with momentum 0.3, and non-affine with the default momentum (0.1)."""
    return nn.Sequential(
        nn.Linear(4, 8),
        nn.BatchNorm1d(8, momentum=0.3),
        nn.ReLU(),
        nn.Linear(8, 8),
        nn.BatchNorm1d(8, affine=False),
        nn.ReLU(),
        nn.Linear(8, 1),
    )


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(SAMPLES, 4, generator=generator) * 3 + 1
    return TensorDataset(x, x[:, :2].prod(1, keepdim=True))


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = net()

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def report(module: nn.Module) -> dict:
    """BatchNorm buffers, evaluation-mode predictions on the CPU, and the hooks left on the BatchNorm modules."""
    module = module.cpu().eval()
    norms = [m for m in module.modules() if isinstance(m, nn.BatchNorm1d)]
    with torch.no_grad():
        predicted = module(dataset().tensors[0][:GLOBAL_BATCH]).flatten().tolist()
    return {
        "running_var": [m.running_var.tolist() for m in norms],
        "running_mean": [m.running_mean.tolist() for m in norms],
        "batches": [int(m.num_batches_tracked) for m in norms],
        "predicted": predicted,
        "hooks_left": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in norms),
    }


def run(api: str, accelerator: str, strategy: object, per_device_batch: int, devices: object = 1) -> dict:
    """Train one epoch (4 steps of a global batch of 16, in order) and :func:`report` the trained model."""
    torch.manual_seed(0)
    loader = DataLoader(dataset(), batch_size=per_device_batch)
    if api == "trainer":
        model = Model()
        trainer = L.Trainer(
            accelerator=accelerator,
            devices=devices,
            strategy=strategy,
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(model, loader)
        return report(model.net)
    fabric = L.Fabric(accelerator=accelerator, devices=devices, strategy=strategy)
    fabric.launch()
    plain = net()
    module, optimizer = fabric.setup(plain, torch.optim.SGD(plain.parameters(), lr=0.01))
    for x, y in fabric.setup_dataloaders(loader):
        optimizer.zero_grad()
        fabric.backward(nn.functional.mse_loss(module(x), y))
        optimizer.step()
    trained = net()
    trained.load_state_dict({k: v.cpu() for k, v in module.state_dict().items()})
    row = report(trained)
    row["hooks_left"] = report(plain)["hooks_left"]  # Fabric has no teardown: the hooks stay (inert on the CPU)
    return row


class ReportsEachRank(L.Callback):
    """Writes each replica's :func:`report` to ``<out>/rank<r>.json`` when training ends (buffers differ by rank)."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trained = net()
        trained.load_state_dict({k: v.cpu() for k, v in pl_module.net.state_dict().items()})
        with open(os.path.join(self.out, f"rank{trainer.global_rank}.json"), "w") as file:
            json.dump(report(trained), file)


def spawn_run(devices: int, out: str) -> dict:
    """The Trainer on ``"xla"`` (one worker per device, each BatchNorm on its own batch, as DDP): each rank's model.

    Each replica's loader batch is ``GLOBAL_BATCH / devices`` rows of the distributed sampler
    Lightning injects (shuffled, seed 0).
    """
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import xla_cpu_harness

    xla_cpu_harness.install()
    torch.manual_seed(0)
    trainer = L.Trainer(
        accelerator="xla",
        devices=devices,
        strategy="xla",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ReportsEachRank(out)],
    )
    trainer.fit(Model(), DataLoader(dataset(), batch_size=GLOBAL_BATCH // devices))
    ranks = {}
    for rank in range(devices):
        with open(os.path.join(out, f"rank{rank}.json")) as file:
            ranks[str(rank)] = json.load(file)
    return ranks


def replicas_on_the_cpu(devices: int) -> dict:
    """What each rank of :func:`spawn_run` should hold: one CPU copy of the model per replica, each fed that
    replica's rows, their gradients averaged (as ``xm.optimizer_step`` averages them) at every step."""
    torch.manual_seed(0)
    first = Model().net  # the same initial weights as the Trainer's model
    copies = [first] + [copy.deepcopy(first) for _ in range(devices - 1)]
    optimizers = [torch.optim.SGD(c.parameters(), lr=0.01) for c in copies]
    x, y = dataset().tensors
    per_device = GLOBAL_BATCH // devices
    # Lightning's sampler for a training loader on several ranks: shuffled, seed 0, epoch 0
    shares = [list(DistributedSampler(dataset(), devices, rank, shuffle=True, seed=0)) for rank in range(devices)]
    for step in range(SAMPLES // GLOBAL_BATCH):
        for module, share in zip(copies, shares, strict=True):
            module.zero_grad()
            mine = share[step * per_device : (step + 1) * per_device]
            nn.functional.mse_loss(module(x[mine]), y[mine]).backward()
        for parameters in zip(*(c.parameters() for c in copies), strict=True):
            mean = torch.stack([p.grad for p in parameters]).mean(0)
            for p in parameters:
                p.grad = mean.clone()
        for optimizer in optimizers:
            optimizer.step()
    return {str(rank): report(module) for rank, module in enumerate(copies)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--spawn", action="store_true", help='the "xla" strategy (with tests/xla_cpu_harness.py)')
    args = parser.parse_args()
    devices = int(os.environ["CPU_NUM_DEVICES"])
    rows = {}
    if args.spawn:
        rows["trainer_xla"] = spawn_run(devices, args.out)
        rows["trainer_cpu_replicas"] = replicas_on_the_cpu(devices)
        with open(os.path.join(args.out, "report.json"), "w") as file:
            json.dump(rows, file)
        return
    for api in ("trainer", "fabric"):
        for strategy in ("xla_spmd", "xla_fsdp_v2"):
            rows[f"{api}_{strategy}"] = run(api, "xla", strategy, GLOBAL_BATCH // devices, "auto")
    for api in ("trainer", "fabric"):  # CPU runs last: a CPU backward before the XLA runtime starts is refused
        rows[f"{api}_cpu"] = run(api, "cpu", "auto", GLOBAL_BATCH)
    with open(os.path.join(args.out, "report.json"), "w") as file:
        json.dump(rows, file)


if __name__ == "__main__":
    main()

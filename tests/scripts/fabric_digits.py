"""A plain Fabric training loop on scikit-learn's digits, on N PJRT CPU devices, for tests/test_fabric.py.

Each rank writes its own report, ``<out>/rank<N>.json``: the classes Fabric got, the parameter dtype,
the world size and the test accuracy (correct predictions summed over ranks with ``fabric.all_reduce``).
One file per rank, not lines on a shared stdout: ranks of one worker process are threads, and their
``print`` calls interleave (the text and its newline are separate writes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import lightning as L
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def datasets() -> tuple[TensorDataset, TensorDataset]:
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    scaler = StandardScaler().fit(x_train)
    as_tensors = lambda x, y: TensorDataset(torch.tensor(scaler.transform(x), dtype=torch.float32), torch.tensor(y))  # noqa: E731
    return as_tensors(x_train, y_train), as_tensors(x_test, y_test)


def train(fabric: L.Fabric, epochs: int, out: str) -> None:
    fabric.seed_everything(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model, optimizer = fabric.setup(model, optimizer)
    train_set, test_set = datasets()
    train_loader, test_loader = fabric.setup_dataloaders(
        DataLoader(train_set, batch_size=32, shuffle=True, drop_last=True), DataLoader(test_set, batch_size=32)
    )
    for _ in range(epochs):
        for x, y in train_loader:
            loss = nn.functional.cross_entropy(model(x).float(), y)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    correct = torch.zeros(1, device=fabric.device)
    with torch.no_grad():
        for x, y in test_loader:
            correct += (model(x).argmax(dim=-1) == y).sum()
    total = fabric.all_reduce(correct, reduce_op="sum")
    report = {
        "rank": fabric.global_rank,
        "world_size": fabric.world_size,
        "strategy": type(fabric.strategy).__module__ + "." + type(fabric.strategy).__name__,
        "precision": type(fabric.strategy.precision).__name__,
        "accelerator": type(fabric.accelerator).__module__,
        "dtype": str(next(model.parameters()).dtype),
        "accuracy": total.item() / len(test_set),
    }
    with open(os.path.join(out, f"rank{fabric.global_rank}.json"), "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", required=True, help="folder for the per-rank reports")
    args = parser.parse_args()
    if args.strategy == "xla":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import xla_cpu_harness

        xla_cpu_harness.install()
    fabric = L.Fabric(accelerator="tpu", devices=args.devices, strategy=args.strategy, precision=args.precision)
    fabric.launch(train, args.epochs, args.out)

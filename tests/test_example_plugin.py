"""The third-party example (plugins/example, distribution trainer-plugins-localsgd), used by name only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import json, os, sys
import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

OUT = os.environ["OUT"]


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        with open(os.path.join(OUT, f"rank{self.global_rank}.jsonl"), "a") as file:
            file.write(json.dumps(index.tolist()) + "\\n")
        return nn.functional.cross_entropy(self.layer(x), y)

    def on_train_end(self):
        summary = {"strategy": type(self.trainer.strategy).__name__,
                   "is_distributed": self.trainer._accelerator_connector.is_distributed,
                   "weights": self.layer.weight.tolist()}
        with open(os.path.join(OUT, f"end{self.global_rank}.json"), "w") as file:
            json.dump(summary, file)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x, y = torch.randn(32, 4, generator=generator), torch.randint(0, 2, (32,), generator=generator)
        data = TensorDataset(x, y, torch.arange(32))
        return DataLoader(data, batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    if sys.argv[1] == "trainer":
        L.Trainer(accelerator="cpu", devices=2, strategy="local_sgd", max_epochs=2, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False).fit(Model())
    else:
        LightningCLI(Model, args=sys.argv[2:], save_config_callback=None)
"""


def run(tmp_path: Path, *args: str) -> dict:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), *args],
        env={**os.environ, "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = {
        int(p.stem[4:]): [i for line in p.read_text().splitlines() for i in json.loads(line)]
        for p in tmp_path.glob("rank*.jsonl")
    }
    ends = {int(p.stem[3:]): json.loads(p.read_text()) for p in tmp_path.glob("end*.json")}
    return {"ranks": ranks, "ends": ends}


def check_two_replicas(found: dict, epochs: int) -> None:
    assert sorted(found["ranks"]) == [0, 1]
    assert sorted(found["ranks"][0] + found["ranks"][1]) == sorted(list(range(32)) * epochs)  # each rank its half
    assert {end["strategy"] for end in found["ends"].values()} == {"LocalSGDStrategy"}
    assert all(end["is_distributed"] is True for end in found["ends"].values())  # its own truthful answer
    assert found["ends"][0]["weights"] == found["ends"][1]["weights"]  # averaged at the end of fit


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_a_plain_trainer_trains_with_the_example_strategy_by_name(tmp_path):
    check_two_replicas(run(tmp_path, "trainer"), epochs=2)


@pytest.mark.slow  # CI budget: primary tox cell only (tox.ini)
def test_lightning_cli_selects_the_example_strategy_by_name(tmp_path):
    pytest.importorskip("jsonargparse")
    args = [
        "fit",
        "--trainer.strategy",
        "local_sgd",
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "2",
        "--trainer.max_epochs",
        "1",
        "--trainer.logger",
        "false",
        "--trainer.enable_checkpointing",
        "false",
    ]
    check_two_replicas(run(tmp_path, "cli", *args), epochs=1)


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_the_example_strategy_is_not_declared_distributed_so_its_own_answer_counts():
    L = pytest.importorskip("lightning")
    single = L.Trainer(accelerator="cpu", devices=1, strategy="local_sgd", logger=False)._accelerator_connector
    assert single.strategy.is_distributed is False and single.is_distributed is False
    assert single.plugin_connector.explanation.as_dicts()[-1]["reason"] == "the strategy's own is_distributed attribute"

"""The XLA strategies in a process torchrun started (tests/test_xla_torchrun.py runs it under torchrun x 2).

Usage: ``torchrun --nproc_per_node=2 --master_addr=127.0.0.1 xla_torchrun.py OUT``; each process
writes ``OUT.<RANK>.json``. First on torch_xla's own PJRT CPU world (each process is a world of its
own: the strategy must refuse it), then with the runtime's figures of one TPU host with two chips,
one process per chip (``xla_plugins.testing.simulated_runtime``: only what needs TPU is simulated);
torch_xla's rendezvous, process group, devices and graphs stay real. Records
the cluster environment, ranks and world size the strategies report, how often the launchers spawned,
the calls made into torch_xla's torchrun support, and the sample indices each rank trained on.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch_xla.distributed.xla_backend  # noqa: F401  registers xla://, so the spy below sees its calls
from torch_xla._internal import pjrt

OUT = sys.argv[1]
RANK, LOCAL_RANK = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
record: dict = {"initialize_multiprocess": [], "init_process_group": [], "spawns": 0}


def _spy(module, name, log):
    original = getattr(module, name)

    def spy(*args, **kwargs):
        log(args, kwargs)
        return original(*args, **kwargs)

    setattr(module, name, spy)


_spy(pjrt, "initialize_multiprocess", lambda a, k: record["initialize_multiprocess"].append(list(a)))
_spy(dist, "init_process_group", lambda a, k: record["init_process_group"].append([*a, k.get("init_method")]))

from xla_plugins.strategies.launchers import xla as launchers  # noqa: E402

_spy(launchers, "spawn_replicas", lambda a, k: record.__setitem__("spawns", record["spawns"] + 1))


def strategy_view(strategy) -> dict:
    return {
        "environment": type(strategy.cluster_environment).__name__,
        "launcher": None if strategy.launcher is None else type(strategy.launcher).__name__,
        "world": [strategy.world_size, strategy.global_rank, strategy.local_rank, strategy.node_rank],
    }


def trainer_run() -> dict:
    import lightning as L
    from torch.utils.data import DataLoader

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[int] = []

        def training_step(self, batch, batch_idx):
            self.view = strategy_view(self.trainer.strategy)
            self.seen += batch.tolist()
            return self.layer(batch.float().unsqueeze(1)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = L.Trainer(
        accelerator="xla",
        devices="auto",
        strategy="xla",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Model()
    result: dict = {"devices": len(trainer.strategy.parallel_devices)}
    try:
        trainer.fit(model, DataLoader(torch.arange(8), batch_size=2))
    except RuntimeError as error:
        return {**result, "error": str(error)}
    return {**result, **model.view, "seen": model.seen, "backend": dist.get_backend()}


def fabric_run() -> dict:
    import lightning as L
    from torch.utils.data import DataLoader

    fabric = L.Fabric(accelerator="xla", devices="auto", strategy="xla")
    fabric.launch()
    loader = fabric.setup_dataloaders(DataLoader(torch.arange(8), batch_size=2))
    seen = [index for batch in loader for index in batch.cpu().tolist()]
    return {**strategy_view(fabric.strategy), "seen": seen}


def spmd_run() -> dict:
    import lightning as L

    try:
        L.Trainer(accelerator="xla", devices="auto", strategy="xla_spmd", max_epochs=1, logger=False)
    except ValueError as error:
        return {"error": str(error)}
    return {}


def main() -> None:
    from xla_plugins.runtime._world import RuntimeFigures
    from xla_plugins.testing import simulated_runtime

    record["cpu"] = trainer_run()  # joins torch_xla's world (real), then refuses it: one XLA world per process
    # one TPU host, two chips, one torchrun process each: what torch_xla reports there
    figures = RuntimeFigures(2, RANK, 2, 2, 1, global_ordinal=RANK, local_ordinal=LOCAL_RANK)
    with simulated_runtime(lambda: figures):
        record["trainer"] = trainer_run()  # reuses the process group joined above
        record["fabric"] = fabric_run()
        record["spmd"] = spmd_run()
    with open(f"{OUT}.{RANK}.json", "w") as file:
        json.dump(record, file)


if __name__ == "__main__":
    main()

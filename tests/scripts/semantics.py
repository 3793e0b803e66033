"""What a Lightning user expects of an XLA strategy, for tests/test_semantics.py: one JSON report.

Run as ``semantics.py --strategy S --devices N`` (a script: XLA launching needs
``if __name__ == "__main__"``); prints one line ``REPORT {...}`` with:

* ``steps``: training steps of one epoch on a 62-sample loader with ``batch_size=4``;
* ``logged``: ``self.log(..., sync_dist=True, reduce_fx=...)`` of the values 0..15 (a validation
  loader of two batches of 8), and ``strategy.reduce``/``all_gather`` of each replica's rank;
* ``seeds``: trained weights of a model with dropout after ``seed_everything`` 1, 1 and 2;
* ``fabric``: each Fabric set-up path (trains: weights changed, or the error it raised);
* for ``xla_spmd`` also ``order`` (a ``shuffle=False`` loader's samples per device and step),
  ``bucketed`` (a plain ``Sampler`` of index lists as ``batch_sampler``), ``global_steps``
  (``batch="global"``) and ``finder`` (Lightning's batch-size finder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, BatchSizeFinder
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

SIZE, BATCH = 62, 4
SEEDS = (("1", 1), ("1 again", 1), ("2", 2))
SPMD = False


def quiet_trainer(**flags: object) -> L.Trainer:
    base = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    return L.Trainer(**{**base, **flags})


def indexed(size: int) -> TensorDataset:
    features = torch.randn(size, 4, generator=torch.Generator().manual_seed(0))
    return TensorDataset(features, torch.arange(size))


def device_rows(tensor: torch.Tensor) -> list[list[int]]:
    """Under SPMD: what each device holds of ``tensor`` (its shard); else the tensor itself as one row."""
    if not (SPMD and tensor.device.type == "xla"):
        return [tensor.tolist()]
    import torch_xla

    torch_xla.sync(wait=True)
    shards = torch_xla._XLAC._get_local_shards([tensor])[0]
    return [shard.tolist() for shard, _ in sorted(shards, key=lambda item: int(item[1].split(":")[1]))]


class Probe(L.LightningModule):
    """Counts steps, records sample indices per device, logs reductions of 0..15."""

    def __init__(self, out: str, dropout: float = 0.0) -> None:
        super().__init__()
        self.out = out
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(dropout), nn.Linear(16, 1))
        self.batch_size = BATCH

    def write(self, **row: object) -> None:
        with open(os.path.join(self.out, f"rank{self.global_rank}.jsonl"), "a") as file:
            file.write(json.dumps(row) + "\n")

    def training_step(self, batch, batch_idx):
        x, index = batch
        self.write(kind="step", rows=device_rows(index))
        return self.net(x).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        (values,) = batch
        for fx in ("mean", "sum", "max", "min"):
            reduced = values.mean() if fx == "mean" else getattr(values, fx)()
            self.log(fx, reduced, sync_dist=True, reduce_fx=fx, batch_size=len(values))

    def on_validation_epoch_end(self) -> None:
        mine = torch.tensor(float(self.global_rank), device=self.device)
        ops = {op: self.trainer.strategy.reduce(mine, reduce_op=op).item() for op in ("mean", "sum", "max", "min")}
        self.write(kind="collectives", reduced=ops, gathered=self.all_gather(mine).flatten().tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def rows(out: str, kind: str) -> dict[int, list[dict]]:
    found: dict[int, list[dict]] = {}
    for name in sorted(os.listdir(out)):
        if name.startswith("rank"):
            with open(os.path.join(out, name)) as file:
                lines = [json.loads(line) for line in file]
            found[int(name[4:-6])] = [line for line in lines if line["kind"] == kind]
    return found


def fit_and_validate(args: argparse.Namespace, out: str) -> dict:
    os.makedirs(out)
    model = Probe(out)
    values = TensorDataset(torch.arange(16.0))
    trainer = quiet_trainer(accelerator="xla", devices=args.devices, strategy=args.strategy, max_epochs=1)
    trainer.fit(
        model,
        DataLoader(indexed(SIZE), batch_size=BATCH, shuffle=True),
        DataLoader(values, batch_size=8),
    )
    steps = {rank: len(found) for rank, found in rows(out, "step").items()}
    collectives = {rank: found[-1] for rank, found in rows(out, "collectives").items()}
    metrics = {key: float(value) for key, value in trainer.callback_metrics.items()}
    return {"steps": steps, "logged": metrics, "collectives": collectives}


def trained_weights(args: argparse.Namespace, seed: int, name: str) -> list[float]:
    torch.manual_seed(0)
    model = Probe(os.path.join(args.out, f"seed {name}"), dropout=0.5)  # the same initial weights for every seed
    os.makedirs(model.out)
    L.seed_everything(seed)
    trainer = quiet_trainer(
        accelerator="xla", devices=args.devices, strategy=args.strategy, max_steps=3, use_distributed_sampler=False
    )  # no sampler seeded from PL_GLOBAL_SEED: only the device RNG can tell the seeds apart
    trainer.fit(model, DataLoader(indexed(SIZE), batch_size=BATCH))
    return [p.detach().cpu().flatten().tolist()[:8] for p in model.parameters()][0]


def one_fabric_path(fabric: L.Fabric, path: str) -> str:
    """Set up a linear model and SGD by ``path``, take two steps: 'trains', or the error raised."""
    torch.manual_seed(0)
    module = nn.Linear(4, 1)
    try:
        if path == "setup":
            model, optimizer = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
        elif path == "setup_module_then_setup_optimizers":
            optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
            model = fabric.setup_module(module)
            optimizer = fabric.setup_optimizers(optimizer)
        else:  # an optimizer created after setup_module
            model = fabric.setup_module(module)
            optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    except Exception as error:  # noqa: BLE001 - the report names it
        return f"{type(error).__name__}: {error}"
    before = model.weight.detach().cpu().clone()
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)).to(fabric.device)
    for _ in range(2):
        fabric.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    return "trains" if not torch.equal(model.weight.detach().cpu(), before) else "DID NOT TRAIN"


def fabric_seeded_weights(fabric: L.Fabric, seed: int, initial: dict) -> list[float]:
    """``fabric.seed_everything(seed)``, then two steps of a model with dropout from ``initial`` weights."""
    fabric.seed_everything(seed)
    module = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 1))
    module.load_state_dict(initial)
    model, optimizer = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
    x = torch.ones(8, 4).to(fabric.device)
    for _ in range(2):
        fabric.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    return module[0].weight.detach().cpu().flatten().tolist()[:8]


def all_fabric_paths(fabric: L.Fabric, out: str) -> None:
    paths = ("setup", "setup_module_then_setup_optimizers", "optimizer_after_setup_module")
    report: dict = {path: one_fabric_path(fabric, path) for path in paths}
    torch.manual_seed(0)
    initial = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 1)).state_dict()
    # The replicas of one worker are threads sharing torch's global seed: none may seed with 1
    # (and set up, which seeds its device from that global seed) while another still seeds with 0.
    fabric.barrier()
    report["seeds"] = {name: fabric_seeded_weights(fabric, seed, initial) for name, seed in SEEDS}
    mine = torch.tensor(float(fabric.global_rank), device=fabric.device)
    report["reduced"] = {op: fabric.all_reduce(mine, reduce_op=op).item() for op in ("mean", "sum", "max", "min")}
    if fabric.global_rank == 0:
        with open(os.path.join(out, "fabric.json"), "w") as file:
            json.dump(report, file)


def fabric_paths(args: argparse.Namespace) -> dict:
    """Each documented Fabric set-up path: 'trains', or the error it raised (rank 0's report)."""
    fabric = L.Fabric(accelerator="xla", devices=args.devices, strategy=args.strategy)
    fabric.launch(all_fabric_paths, args.out)
    with open(os.path.join(args.out, "fabric.json")) as file:
        return json.load(file)


def spmd_only(args: argparse.Namespace) -> dict:
    from xla_plugins import XLASPMDStrategy

    report: dict = {}
    out = os.path.join(args.out, "order")
    os.makedirs(out)
    trainer = quiet_trainer(accelerator="xla", devices=args.devices, strategy=args.strategy, max_epochs=1)
    trainer.fit(Probe(out), DataLoader(indexed(SIZE), batch_size=BATCH, shuffle=False))
    report["order"] = [row["rows"] for row in rows(out, "step")[0]]

    class Buckets(Sampler):
        """A plain Sampler yielding index lists (not a BatchSampler): buckets of 3, 5, 3, 5, ..."""

        def __iter__(self):
            start, turn = 0, 0
            while start < SIZE:
                size = (3, 5)[turn % 2]
                yield list(range(start, min(start + size, SIZE)))
                start, turn = start + size, turn + 1

        def __len__(self) -> int:
            return sum(1 for _ in iter(self))

    out = os.path.join(args.out, "bucketed")
    os.makedirs(out)
    trainer = quiet_trainer(accelerator="xla", devices=args.devices, strategy=args.strategy, max_epochs=1)
    trainer.fit(Probe(out), DataLoader(indexed(SIZE), batch_sampler=Buckets()))
    report["bucketed"] = {"batches": len(Buckets()), "steps": [row["rows"] for row in rows(out, "step")[0]]}

    out = os.path.join(args.out, "global")
    os.makedirs(out)
    trainer = quiet_trainer(accelerator="xla", strategy=XLASPMDStrategy(batch="global"), max_epochs=1)
    trainer.fit(Probe(out), DataLoader(indexed(SIZE), batch_size=BATCH))
    report["global_steps"] = len(rows(out, "step")[0])

    class Writer(BasePredictionWriter):
        """Keeps, per step, the batch indices Lightning hands prediction writers and the predicted sample ids."""

        def __init__(self) -> None:
            super().__init__("batch")
            self.steps: list[list[list[int]]] = []

        def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
            self.steps.append([list(batch_indices), prediction.cpu().tolist()])

    writer = Writer()
    model = Probe(args.out)
    model.predict_step = lambda batch, batch_idx: batch[1]  # type: ignore[method-assign]
    trainer = quiet_trainer(accelerator="xla", devices=args.devices, strategy=args.strategy, callbacks=[writer])
    trainer.predict(model, DataLoader(indexed(SIZE), batch_size=BATCH, shuffle=True), return_predictions=False)
    report["predicted"] = writer.steps

    report["finder"] = {
        accelerator: find_batch_size(os.path.join(args.out, f"finder-{accelerator}"), accelerator=accelerator, **flags)
        for accelerator, flags in (("xla", {"devices": args.devices, "strategy": args.strategy}), ("cpu", {}))
    }
    return report


def find_batch_size(out: str, **flags: object) -> dict:
    """Lightning's batch-size finder (power scaling from 2, two trials): its choice and the model's batch_size."""
    os.makedirs(out)
    finder = BatchSizeFinder(mode="power", init_val=2, max_trials=2, steps_per_trial=1)
    model = Probe(out)
    model.train_dataloader = lambda: DataLoader(indexed(SIZE), batch_size=model.batch_size)  # type: ignore[method-assign]
    model.val_dataloader = lambda: DataLoader(TensorDataset(torch.arange(16.0)), batch_size=8)  # type: ignore[method-assign]
    trainer = quiet_trainer(max_steps=1, callbacks=[finder], default_root_dir=out, **flags)
    trainer.fit(model)
    return {"optimal": finder.optimal_batch_size, "model": model.batch_size}


def main() -> None:
    global SPMD
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    SPMD = args.strategy == "xla_spmd"
    if args.strategy == "xla":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import xla_cpu_harness

        xla_cpu_harness.install()
    report = fit_and_validate(args, os.path.join(args.out, "fit"))
    report["seeds"] = {name: trained_weights(args, seed, name) for name, seed in SEEDS}
    if SPMD:
        report.update(spmd_only(args))
    # Last: a backward pass in this process would be inherited, half set up, by later forked workers.
    report["fabric"] = fabric_paths(args)
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()

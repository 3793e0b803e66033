"""Tied weights through every move of one XLA strategy, for tests/test_tied_weights.py.

A tiny language model whose output layer shares the embedding's weight (``dec.weight = emb.weight``)
is trained twice in a row, then resumed from the first run's checkpoint, with the Trainer and with
Fabric on the given strategy; the same runs on plain Lightning on the CPU give the reference. The
report (``<out>/report.json``) holds, per API, the parameter count, whether the tie holds and the
weights after each run (on ``xla_fsdp_v2`` also the Trainer's runs with sharded checkpoints). Run as
a script (``__main__``), as XLA launching needs: the CPU runs come last, since a backward pass in
this process would be inherited, half set up, by forked workers of the spawn strategy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, DIM, BATCH, STEPS, LR = 16, 8, 16, 3, 0.5
# One epoch of STEPS batches: the first run's checkpoint is at an epoch's end, where a resume on the XLA
# strategies (which continue inside an epoch, trainer_plugins.long_runs._loader_position) and on plain
# Lightning (which starts an interrupted epoch over) train the same batches next.
SAMPLES = BATCH * STEPS


class TiedLM(L.LightningModule):
    """Embedding, one hidden layer, and an output layer whose weight *is* the embedding's."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mid = nn.Linear(DIM, DIM)
        self.dec = nn.Linear(DIM, VOCAB, bias=False)
        if os.environ.get("UNTIE") != "1":
            self.dec.weight = self.emb.weight
        # Own generator: spawn replicas are threads of one process and would race on the global seed.
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.dec(torch.tanh(self.mid(self.emb(tokens))))

    def training_step(self, batch, batch_idx):
        tokens, targets = batch
        return nn.functional.cross_entropy(self(tokens), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


def data() -> TensorDataset:
    tokens = torch.randint(0, VOCAB, (SAMPLES,), generator=torch.Generator().manual_seed(1))
    return TensorDataset(tokens, (tokens * 3 + 1) % VOCAB)


def state(model: nn.Module) -> dict:
    """What the test checks of ``model`` after a run: parameter count, the tie, the weights (CPU lists)."""
    return {
        "count": len(list(model.parameters())),
        "tied": model.dec.weight is model.emb.weight,
        "weights": {k: v.detach().cpu().flatten().tolist() for k, v in model.state_dict().items()},
    }


def trainer_runs(strategy, devices: int, accelerator: str, out: str, resume_from: str | None = None) -> dict:
    """Two fits of one model (a new Trainer each), then a fresh model resumed from the first fit's checkpoint."""

    def trainer(name: str, steps: int, **flags) -> L.Trainer:
        return L.Trainer(
            accelerator=accelerator,
            devices=devices,
            strategy=strategy() if callable(strategy) else strategy,
            max_steps=steps,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=os.path.join(out, name),
            # Every spawn replica trains on the whole batch (Lightning's injected sampler would shuffle):
            # the mean of their equal gradients is the CPU run's gradient.
            use_distributed_sampler=False,
            **flags,
        )

    loader = DataLoader(data(), batch_size=BATCH)
    model, runs = TiedLM(), []
    saves = ModelCheckpoint(dirpath=out, filename="first", every_n_train_steps=STEPS)
    first = trainer("first", STEPS, callbacks=[saves])
    first.fit(model, loader)
    runs.append(state(model))
    checkpoint = os.path.join(out, "first.ckpt")
    trainer("second", STEPS, enable_checkpointing=False).fit(model, loader)
    runs.append(state(model))
    resumed = TiedLM()
    trainer("resumed", 2 * STEPS, enable_checkpointing=False).fit(resumed, loader, ckpt_path=resume_from or checkpoint)
    runs.append(state(resumed))
    return {"runs": runs, "checkpoint": checkpoint, "strategy": type(first.strategy).__name__}


def fabric_loop(fabric: L.Fabric, model: nn.Module, separately: bool) -> dict:
    """One training run: set up (module and optimizer together, or one after the other), then STEPS steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    if separately:
        module = fabric.setup_module(model)
        optimizer = fabric.setup_optimizers(optimizer)
    else:
        module, optimizer = fabric.setup(model, optimizer)
    tokens, targets = data().tensors
    for step in range(STEPS):
        rows = slice(step * BATCH + fabric.global_rank, (step + 1) * BATCH, fabric.world_size)  # this rank's share
        x, y = fabric.to_device((tokens[rows], targets[rows]))
        loss = nn.functional.cross_entropy(module(x), y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    in_optimizer = [p for group in optimizer.param_groups for p in group["params"]]
    mine = {id(p) for p in model.parameters()}
    return {
        **state(model),
        "optimizer": len(in_optimizer),
        "optimizer_on_model": all(id(p) in mine for p in in_optimizer),
    }


def fabric_runs(fabric: L.Fabric, separately: bool) -> list[dict]:
    """Two runs of one model: the first sets it up as ``separately`` says, the second with ``fabric.setup``."""
    model = TiedLM()
    return [fabric_loop(fabric, model, separately), fabric_loop(fabric, model, False)]


def strategies(name: str, api: str, **options):
    """The strategy flag for ``name``: the registered name, or (SPMD) an instance whose loader batch is global."""
    if name in ("single_xla", "xla"):
        return name
    from xla_plugins.strategies.xla_fsdp_v2 import FabricXLAFSDPv2Strategy, XLAFSDPv2Strategy
    from xla_plugins.strategies.xla_spmd import FabricXLASPMDStrategy, XLASPMDStrategy

    classes = {
        ("xla_spmd", "trainer"): XLASPMDStrategy,
        ("xla_spmd", "fabric"): FabricXLASPMDStrategy,
        ("xla_fsdp_v2", "trainer"): XLAFSDPv2Strategy,
        ("xla_fsdp_v2", "fabric"): FabricXLAFSDPv2Strategy,
    }
    cls = classes[(name, api)]
    return (lambda: cls(batch="global", **options)) if api == "trainer" else cls(batch="global", **options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=("single_xla", "xla", "xla_spmd", "xla_fsdp_v2"), required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.strategy == "xla":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import xla_cpu_harness

        xla_cpu_harness.install()
    separately = args.strategy != "xla"  # the spawn strategy refuses setup_optimizers after setup_module
    report: dict = {}

    xla = trainer_runs(strategies(args.strategy, "trainer"), args.devices, "xla", os.path.join(args.out, "xla"))
    if args.strategy == "xla_fsdp_v2":  # the sharded checkpoint format has a load path of its own
        sharded = strategies(args.strategy, "trainer", state_dict_type="sharded")
        report["sharded"] = trainer_runs(sharded, args.devices, "xla", os.path.join(args.out, "sharded"))["runs"]
    fabric = L.Fabric(accelerator="xla", devices=args.devices, strategy=strategies(args.strategy, "fabric"))
    fabric_xla = fabric.launch(fabric_runs, separately)
    report["xla"] = {"trainer": xla["runs"], "fabric": fabric_xla}
    report["strategies"] = [xla["strategy"], type(fabric.strategy).__name__]

    cpu = trainer_runs("auto", 1, "cpu", os.path.join(args.out, "cpu"), resume_from=xla["checkpoint"])
    cpu_fabric = L.Fabric(accelerator="cpu", devices=1)
    report["cpu"] = {"trainer": cpu["runs"], "fabric": fabric_runs(cpu_fabric, False)}
    with open(os.path.join(args.out, "report.json"), "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    main()

"""``torch.utils.checkpoint`` inside a LightningModule on XLA strategies, for tests/test_activation_checkpointing.py.

A small model runs its middle block (linear, tanh, dropout, linear) plainly, or through
``torch.utils.checkpoint.checkpoint`` with ``use_reentrant=True`` (what Hugging Face's
``gradient_checkpointing_enable()`` uses by default) or ``False``. The block's dropout draws from the
XLA random state, so the recomputed block equals the first only if that state is saved and restored:
the weights after training are the same in all three runs exactly when it is.

Run as a script (``__main__``), as XLA launching needs: ``--strategies`` in the given order (the spawn
strategy ``xla`` first, before this process starts an SPMD runtime), ``--modes`` (default all),
``--out`` for ``report.json``:
``{"weights": {strategy: {mode: weights}}, "warnings": {strategy: [message, ...]}}`` (every warning
raised in the fits; the test checks none of torch's backward-hook warnings is among them). The test
imports :func:`fit` to run ``single_xla`` in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import lightning as L
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

#: ``off``: no checkpointing; the other two: ``torch.utils.checkpoint`` with ``use_reentrant`` True or False.
MODES = ("off", "reentrant", "non_reentrant")
BATCH, STEPS, LR = 8, 4, 0.1


class CheckpointedBlock(L.LightningModule):
    """Linear -> [linear, tanh, dropout(0.5), linear] -> linear; the bracketed block checkpointed as ``mode`` says."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.head = nn.Linear(8, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 16))
        self.tail = nn.Linear(16, 1)
        # Own generator: spawn replicas are threads of one process and would race on the global seed.
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.head(x)
        if self.mode == "off":
            hidden = self.block(hidden)
        else:
            hidden = checkpoint(self.block, hidden, use_reentrant=self.mode == "reentrant")
        return self.tail(hidden)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):  # returns nothing: Lightning's usual style
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


def strategy_flag(name: str):
    """The strategy flag for ``name``: the registered name, or (SPMD) an instance whose loader batch is global."""
    if name in ("single_xla", "xla"):
        return name
    from xla_plugins.strategies.xla_fsdp_v2 import XLAFSDPv2Strategy
    from xla_plugins.strategies.xla_spmd import XLASPMDStrategy

    return {"xla_spmd": XLASPMDStrategy, "xla_fsdp_v2": XLAFSDPv2Strategy}[name](batch="global")


def fit(strategy: str, devices: int, mode: str) -> tuple[list[float], list[str]]:
    """Train :class:`CheckpointedBlock` for STEPS steps on ``strategy``, validating after the last.

    Returns:
        Its weights after, flattened, and the message of every warning raised in the fit.
    """
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(BATCH * STEPS, 8, generator=generator)
    samples = TensorDataset(inputs, torch.randn(BATCH * STEPS, 1, generator=generator))
    L.seed_everything(3, verbose=False)  # the XLA strategies seed torch_xla's random state from it too
    model = CheckpointedBlock(mode)
    trainer = L.Trainer(
        accelerator="xla",
        devices=devices,
        strategy=strategy_flag(strategy),
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,  # every spawn replica trains on the whole batch
        num_sanity_val_steps=0,
        limit_val_batches=2,
    )
    with warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always")
        trainer.fit(model, DataLoader(samples, batch_size=BATCH), DataLoader(samples, batch_size=BATCH))
    weights = [value for tensor in model.state_dict().values() for value in tensor.detach().cpu().flatten().tolist()]
    return weights, [str(warning.message) for warning in raised]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategies", nargs="+", choices=("single_xla", "xla", "xla_spmd", "xla_fsdp_v2"))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if "xla" in args.strategies:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import xla_cpu_harness

        xla_cpu_harness.install()
    report: dict = {"weights": {}, "warnings": {}}
    for name in args.strategies:
        runs = {mode: fit(name, 1 if name == "single_xla" else args.devices, mode) for mode in args.modes}
        report["weights"][name] = {mode: weights for mode, (weights, _) in runs.items()}
        report["warnings"][name] = sorted({message for _, messages in runs.values() for message in messages})
    with open(os.path.join(args.out, "report.json"), "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    main()

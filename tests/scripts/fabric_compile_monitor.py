"""A small sequence model trained with a Fabric loop on XLA, with one trigger of late compilation or host
read, for tests/test_fabric_compile_monitor.py.

    python fabric_compile_monitor.py --trigger none|item|padding|branch|eval-item [--strategy S] [--recompiles B]
                                     [--out DIR]

``item``: ``if loss.item() > 100:`` between the forward and ``optimizer.step()``. ``padding``: the
batches of the second epoch are longer (new shapes after the warm-up). ``branch``: the loss is
doubled at step 12 only. ``eval-item``: an evaluation loop under ``torch.no_grad()`` reads each
loss with ``.item()`` (outside any training step). 3 epochs of 8 steps, per-device batches of 1
(the data grow with the devices, so every strategy trains the same steps). Prints one JSON line:
the monitor's reports and summary (from ``finish()``), and the error raised, if any. With
``--strategy xla`` (the spawn strategy, through tests/xla_cpu_harness.py: one replica thread per
device) the loop runs in every replica, each writes that line to ``DIR/rank<N>.json``, and the
process prints what ``fabric.launch`` returned: rank 0's outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any, Optional

import lightning as L
import torch

from xla_plugins.compilation.recompile_budget import LateCompilationWarning

EPOCHS = 3
STEPS = 8


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(tokens).mean(1)).squeeze(-1)


def batches(epoch: int, devices: int, growing: bool) -> list[torch.Tensor]:
    length = 5 + (2 * epoch if growing else 0)
    generator = torch.Generator().manual_seed(epoch)
    return [torch.randint(0, 50, (devices, length), generator=generator) for _ in range(STEPS)]


def train(fabric: Any, trigger: str, strategy: str, out: Optional[str] = None) -> dict:
    """The loop with ``trigger``; the outcome (also written to ``out/rank<N>.json`` when ``out`` is given)."""
    fabric.seed_everything(0)
    # the rows of a batch: one per device of the mesh on the SPMD strategies, one per replica otherwise
    devices = 1 if strategy in ("single_xla", "xla") else len(fabric.strategy.parallel_devices)
    model = Model()
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.01))
    error, step = None, 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for epoch in range(EPOCHS):
                for batch in batches(epoch, devices, growing=trigger == "padding"):
                    loss = model(fabric.to_device(batch)).pow(2).mean()
                    if trigger == "item" and loss.item() > 100:
                        print("large loss")
                    if trigger == "branch" and step == 12:
                        loss = loss * 2  # a Python value (the step number) changes the traced graph once
                    fabric.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                    step += 1
                with torch.no_grad():
                    for batch in batches(0, devices, growing=False)[:2]:
                        loss = model(fabric.to_device(batch)).pow(2).mean()
                        if trigger == "eval-item":
                            print("eval loss", loss.item())
        except Exception as raised:  # noqa: BLE001  # the test checks which
            error = {"type": type(raised).__name__, "message": str(raised), "step": step}
    monitor = getattr(fabric.strategy, "compile_monitor", None)
    summary = monitor.finish() if monitor is not None else None
    outcome = {
        "rank": fabric.global_rank,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, LateCompilationWarning)],
        "reports": monitor.reports if monitor is not None else None,
        "summary": summary,
        "error": error,
        "item_is_torchs": torch.Tensor.item.__qualname__ == "TensorBase.item",
    }
    if out is not None:
        with open(os.path.join(out, f"rank{fabric.global_rank}.json"), "w") as file:
            json.dump(outcome, file)
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trigger", default="none", choices=("none", "item", "padding", "branch", "eval-item"))
    parser.add_argument("--strategy", default="single_xla")
    parser.add_argument("--recompiles", default=None)
    parser.add_argument("--out", default=None, help="folder for each replica's outcome (--strategy xla)")
    args = parser.parse_args()

    strategy: object = args.strategy
    if args.recompiles:
        from xla_plugins.strategies.single_xla import FabricSingleDeviceXLAStrategy

        strategy = FabricSingleDeviceXLAStrategy(recompiles=args.recompiles)
    if args.strategy == "xla":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import xla_cpu_harness

        xla_cpu_harness.install()
    fabric = L.Fabric(accelerator="tpu", devices=1 if args.strategy == "single_xla" else "auto", strategy=strategy)
    if args.strategy == "xla":
        outcome = fabric.launch(train, args.trigger, args.strategy, args.out)
    else:
        fabric.launch()
        outcome = train(fabric, args.trigger, args.strategy)
    print(json.dumps(outcome))


if __name__ == "__main__":
    main()

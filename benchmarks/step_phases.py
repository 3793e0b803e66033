"""Where a steady step's wall time goes, phase by phase: the raw loop against the quiet Trainer, on XLA and on CPU.

    python benchmarks/step_phases.py [--rounds 5] [--epochs 4] [--model small]

One process runs four loops in interleaved rounds (the order rotated each round): the raw loop and
the quiet ``Trainer`` of benchmarks/throughput.py on the XLA device (``raw``, ``plugin``), and the
same two on torch's CPU device (``raw-cpu``, ``trainer-cpu``). The Trainer's step is cut at hooks
Lightning calls on every step, and the raw loop's at the same points:

* ``fetch + move``: from the end of the previous step to ``on_train_batch_start`` (the loader's
  ``next``, the move to the device and, in the Trainer, Lightning's fetcher and batch-transfer hooks);
* ``to training_step``: from there to the first line of ``training_step`` (Lightning's optimizer
  step and closure set-up; nothing in the raw loop);
* ``training_step``: the forward pass and the loss;
* ``to backward``: from the end of ``training_step`` to ``on_before_backward`` (the closure result,
  ``zero_grad``);
* ``backward``: ``on_before_backward`` to ``on_after_backward``;
* ``to optimizer step``: ``on_after_backward`` to ``on_before_optimizer_step`` (gradient clipping
  checks; nothing in the raw loop);
* ``optimizer step + sync``: ``on_before_optimizer_step`` to ``on_train_batch_end`` (the optimizer's
  arithmetic, ``torch_xla.sync()`` on XLA, Lightning's bookkeeping after the step).

Each figure is the median over the rounds of a round's median step (epochs after the first; the
``mean step`` row has the round's mean step instead, as throughput counts it); the
"added" columns take the Trainer's minus the raw loop's within each round first. The hooks the
benchmark overrides cost the same on both devices, so compare the two "added" columns with each
other: where they differ, the XLA path (the plugin, torch_xla's dispatch) costs more or less than
Lightning's loop on CPU.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))

import throughput  # noqa: E402

PHASES = (
    "fetch + move",
    "to training_step",
    "training_step",
    "to backward",
    "backward",
    "to optimizer step",
    "optimizer step + sync",
)
#: The stamps that close each phase, in order; a step's first stamp is the previous step's end.
STAMPS = ("batch_start", "step_start", "step_end", "before_backward", "after_backward", "before_optimizer", "end")
LOOPS = ("raw", "plugin", "raw-cpu", "trainer-cpu")
Phases = dict[str, list[float]]


class Recorder:
    """Collects the phase times (seconds) of the steps after the first epoch."""

    def __init__(self) -> None:
        self.phases: Phases = {phase: [] for phase in (*PHASES, "whole step")}
        self.stamps: dict[str, float] = {}
        self.counting = False

    def stamp(self, name: str) -> None:
        self.stamps[name] = time.perf_counter()

    def step_done(self) -> None:
        """Close a step at the ``end`` stamp just taken; the next step starts from it."""
        if self.counting:
            times = [self.stamps["previous_end"], *(self.stamps[name] for name in STAMPS)]
            for phase, start, end in zip(PHASES, times[:-1], times[1:], strict=True):
                self.phases[phase].append(end - start)
            self.phases["whole step"].append(times[-1] - times[0])
        self.stamps["previous_end"] = self.stamps["end"]


def raw_loop(model: str, epochs: int, recorder: Recorder, cpu: bool) -> None:
    """benchmarks/throughput.py's raw loop with the Trainer's stamps; ``zero_grad`` where Lightning calls it."""
    device, sync = throughput.raw_device(cpu)
    network, loader = throughput.build(model)
    network = network.to(device)
    optimizer = torch.optim.SGD(network.parameters(), lr=throughput.LEARNING_RATE)
    stamp = recorder.stamp
    for epoch in range(epochs):
        recorder.counting = epoch > 0
        stamp("previous_end")
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            stamp("batch_start")
            stamp("step_start")
            loss = nn.functional.cross_entropy(network(x), y)
            stamp("step_end")
            optimizer.zero_grad()
            stamp("before_backward")
            loss.backward()
            stamp("after_backward")
            stamp("before_optimizer")
            optimizer.step()
            sync()
            stamp("end")
            recorder.step_done()


def trainer_loop(model: str, epochs: int, recorder: Recorder, cpu: bool) -> None:
    """The quiet Trainer of benchmarks/throughput.py (``accelerator="xla"`` or ``"cpu"``), stamped at its hooks."""
    import lightning as L

    stamp = recorder.stamp

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.network = throughput.build(model)[0]

        def training_step(self, batch, batch_idx):
            stamp("step_start")
            x, y = batch
            loss = nn.functional.cross_entropy(self.network(x), y)
            stamp("step_end")
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=throughput.LEARNING_RATE)

        def on_before_backward(self, loss):
            stamp("before_backward")

        def on_after_backward(self):
            stamp("after_backward")

        def on_before_optimizer_step(self, optimizer):
            stamp("before_optimizer")

    class Stamps(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            recorder.counting = trainer.current_epoch > 0
            stamp("previous_end")

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            stamp("batch_start")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            stamp("end")
            recorder.step_done()

    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            accelerator="cpu" if cpu else "xla",
            devices=1,
            max_epochs=epochs,
            callbacks=[Stamps()],
            default_root_dir=root,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(Module(), throughput.build(model)[1])


RUNNERS: dict[str, Callable[[str, int, Recorder], None]] = {
    "raw": lambda model, epochs, recorder: raw_loop(model, epochs, recorder, cpu=False),
    "plugin": lambda model, epochs, recorder: trainer_loop(model, epochs, recorder, cpu=False),
    "raw-cpu": lambda model, epochs, recorder: raw_loop(model, epochs, recorder, cpu=True),
    "trainer-cpu": lambda model, epochs, recorder: trainer_loop(model, epochs, recorder, cpu=True),
}


def measure(model: str, rounds: int, epochs: int) -> dict[str, list[dict[str, float]]]:
    """``{loop: [{phase: median ms of the round}, one per round]}``."""
    results: dict[str, list[dict[str, float]]] = {loop: [] for loop in LOOPS}
    for round_index in range(rounds):
        shift = round_index % len(LOOPS)
        for loop in LOOPS[shift:] + LOOPS[:shift]:
            recorder = Recorder()
            RUNNERS[loop](model, epochs, recorder)
            # a finished Trainer holds reference cycles; until they are collected, its XLA tensors
            # stay alive and every later torch_xla.sync() walks them
            gc.collect()
            figures = {phase: 1000 * statistics.median(t) for phase, t in recorder.phases.items()}
            figures["mean step"] = 1000 * statistics.fmean(recorder.phases["whole step"])
            results[loop].append(figures)
    return results


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def table(results: dict[str, list[dict[str, float]]]) -> list[str]:
    def added(trainer: str, raw: str, phase: str) -> list[float]:
        return [t[phase] - r[phase] for t, r in zip(results[trainer], results[raw], strict=True)]

    lines = [
        "| ms a step | raw | plugin | added on XLA | raw-cpu | trainer-cpu | added on CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for phase in (*PHASES, "whole step", "mean step"):
        row = [cell([r[phase] for r in results[loop]]) for loop in LOOPS]
        row.insert(2, cell(added("plugin", "raw", phase)))
        row.append(cell(added("trainer-cpu", "raw-cpu", phase)))
        lines.append(f"| {phase} | " + " | ".join(row) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4, help="epochs a loop; the first is left out")
    parser.add_argument("--model", choices=sorted(throughput.MODELS), default="small")
    args = parser.parse_args()
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    results = measure(args.model, args.rounds, args.epochs)
    print(f"Phases of a step, {args.model} model: median [min-max] over {args.rounds} interleaved rounds")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()

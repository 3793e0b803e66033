"""One training run on PJRT CPU, as JSON: steady-state throughput, compilations, transfers, first step, peak memory.

    python benchmarks/throughput.py --mode raw|plugin|defaults|lightning --model small|wide

``raw``: a hand-written torch_xla loop (``.to(device)``, ``backward``, ``step``, ``torch_xla.sync()``).
``plugin``: a quiet ``lightning.Trainer(accelerator="xla")`` through xla-plugins: no progress bar,
logger, checkpointing or model summary, no ``self.log``.
``defaults``: the same Trainer left at Lightning's defaults (progress bar, logger, ``ModelCheckpoint``,
model summary) with ``self.log("train_loss", loss, prog_bar=True)`` in ``training_step``: how people
write Lightning code. ``XLA_PLUGINS_METRIC_READS=eager`` in the environment turns the plugin's lazy
metric reads off (``run_all.py`` runs that as ``defaults-eager``).
``lightning``: Lightning's own XLA classes, quiet. They only run on TPU (their device count comes
from a TPU probe), so this mode makes Lightning's XLA accelerator count the PJRT CPU device: a
benchmark-only patch, not something the plugin does.

``raw-cpu``, ``trainer-cpu``, ``defaults-cpu``: ``raw``, ``plugin`` and ``defaults`` on torch's own CPU
device, without XLA (``Trainer(accelerator="cpu")``): what Lightning's loop and its defaults cost
where no plugin is involved, the reference for the XLA modes' overhead. Compilations and transfers
do not exist there (reported as ``null``).

Every mode: the same model, data, optimizer (SGD) and dtype (float32). Steady state excludes the
first epoch (graph compilation). Time to first step runs from the start of the loop (``fit``, or the
raw loop's first line) to the end of the first step's execution. Each mode runs in its own process
(``run_all.py`` starts them) so that compilation caches and peak memory are its own.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MODELS = {
    # (input features, hidden width, hidden layers, batch size, samples): 64 steps an epoch
    "small": (64, 128, 2, 32, 2048),  # MLP 64-128-128-10: overhead-bound, about a millisecond a step
    "wide": (64, 1024, 2, 32, 2048),  # MLP 64-1024-1024-10: about ten times the small model's compute
}
MODES = ("raw", "plugin", "defaults", "lightning", "raw-cpu", "trainer-cpu", "defaults-cpu")
LEARNING_RATE = 0.01


def build(model: str) -> tuple[nn.Module, DataLoader]:
    features, width, layers, batch, samples = MODELS[model]
    torch.manual_seed(0)
    blocks: list[nn.Module] = [nn.Linear(features, width), nn.ReLU()]
    for _ in range(layers - 1):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    network = nn.Sequential(*blocks, nn.Linear(width, 10))
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(samples, features, generator=generator), torch.randint(0, 10, (samples,), generator=generator)
    )
    return network, DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)


class Meter:
    """Per-epoch wall time, the loop thread's CPU time, compilations and device-to-host transfers (torch_xla's metrics).

    Args:
        xla: the loop runs on an XLA device; ``False`` for torch's CPU device, where there is
            nothing to wait for and no compilation or transfer to count.
    """

    def __init__(self, xla: bool = True) -> None:
        self.xla = xla
        self.epochs: list[dict[str, float]] = []
        self._start: dict[str, float] = {}
        self.began = time.perf_counter()
        self.first_step_s = float("nan")

    def begin(self) -> None:
        """Mark the start of the loop (time to first step counts from here)."""
        self.began = time.perf_counter()

    def wait(self) -> None:
        """Wait for the device's pending work (on XLA: ``torch_xla.sync(wait=True)``)."""
        if self.xla:
            import torch_xla

            torch_xla.sync(wait=True)

    def first_step_done(self) -> None:
        """Mark the end of the first step: waits for its execution."""
        if self.first_step_s != self.first_step_s:  # still NaN
            self.wait()
            self.first_step_s = time.perf_counter() - self.began

    def counts(self) -> dict[str, float]:
        if not self.xla:
            return {"time": time.perf_counter(), "cpu": time.thread_time(), "process_cpu": time.process_time()}
        import torch_xla.debug.metrics as met

        def count(name: str) -> float:
            data = met.metric_data(name)
            return float(data[0]) if data else 0.0

        return {
            "compiles": count("CompileTime"),
            "transfers": count("TransferFromDeviceTime"),
            "time": time.perf_counter(),
            # CPU seconds of the thread that runs the loop (PJRT CPU computes in its own threads): its
            # Python and tracing work, which a busy machine slows far less than it slows wall time
            "cpu": time.thread_time(),
            # CPU seconds of every thread of the process: the loop's and PJRT CPU's computation of the steps
            "process_cpu": time.process_time(),
        }

    def start_epoch(self) -> None:
        self._start = self.counts()

    def end_epoch(self, steps: int) -> None:
        self.wait()
        now = self.counts()
        self.epochs.append({key: now[key] - self._start[key] for key in now} | {"steps": steps})

    def summary(self) -> dict[str, object]:
        steady = self.epochs[1:]
        steps = sum(epoch["steps"] for epoch in steady)
        compiled = compile_totals() if self.xla else None
        return {
            "steps_per_s": steps / sum(epoch["time"] for epoch in steady),
            "loop_thread_cpu_ms_per_step": 1000 * sum(epoch["cpu"] for epoch in steady) / steps,
            "process_cpu_ms_per_step": 1000 * sum(epoch["process_cpu"] for epoch in steady) / steps,
            "compiles_per_epoch": [int(epoch["compiles"]) for epoch in self.epochs] if self.xla else None,
            "compiles": compiled[0] if compiled else None,
            "compile_s": compiled[1] if compiled else None,
            "transfers_per_step": sum(epoch["transfers"] for epoch in steady) / steps if self.xla else None,
            "first_step_s": self.first_step_s,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }


def compile_totals() -> tuple[int, float]:
    """Compilations of this process so far and their seconds, from torch_xla's ``CompileTime`` metric."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")  # (count, accumulated nanoseconds, samples), None before any
    return (int(data[0]), data[1] / 1e9) if data else (0, 0.0)


def timing_callback(meter: Meter) -> Any:
    """A Lightning callback that times each training epoch and the first step with ``meter``.

    Lightning is imported when this is called, not with this module: the raw loops run without it.
    """
    import lightning as L

    class Timing(L.Callback):
        def __init__(self) -> None:
            self.steps = 0

        def on_train_epoch_start(self, trainer, pl_module):
            self.steps = 0
            meter.start_epoch()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.steps += 1
            meter.first_step_done()

        def on_train_epoch_end(self, trainer, pl_module):
            meter.end_epoch(self.steps)

    return Timing()


def on_cpu(mode: str) -> bool:
    """Whether ``mode`` runs on torch's CPU device rather than XLA."""
    return mode.endswith("-cpu")


def run(mode: str, model: str, epochs: int, meter: Meter) -> None:
    """Train ``model`` for ``epochs`` epochs in ``mode`` (one of :data:`MODES`), timed by ``meter``."""
    if mode in ("raw", "raw-cpu"):
        run_raw(model, epochs, meter, cpu=on_cpu(mode))
    else:
        run_trainer(model, epochs, meter, mode)


def raw_device(cpu: bool) -> tuple[torch.device, Callable[[], object]]:
    """The raw loop's device and what it calls at the end of a step.

    Returns:
        torch's CPU device and nothing to call (``cpu=True``), or torch_xla's device and ``torch_xla.sync``.
    """
    if cpu:
        return torch.device("cpu"), lambda: None
    import torch_xla

    return torch_xla.device(), torch_xla.sync


def run_raw(model: str, epochs: int, meter: Meter, cpu: bool = False) -> None:
    # imported before the clock starts, as Lightning's import does for the Trainer modes: torch_xla,
    # and torch._dynamo, which torch.optim's first step would otherwise import (about a second)
    import torch._dynamo  # noqa: F401

    if not cpu:
        import torch_xla  # noqa: F401
    meter.begin()
    device, sync = raw_device(cpu)
    network, loader = build(model)
    network = network.to(device)
    optimizer = torch.optim.SGD(network.parameters(), lr=LEARNING_RATE)
    for _ in range(epochs):
        meter.start_epoch()
        steps = 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(network(x), y)
            loss.backward()
            optimizer.step()
            sync()
            steps += 1
            if steps == 1:
                meter.first_step_done()
        meter.end_epoch(steps)


def run_trainer(model: str, epochs: int, meter: Meter, mode: str) -> None:
    import tempfile

    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.network = build(model)[0]

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self.network(x), y)
            if defaults:
                self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LEARNING_RATE)

    defaults = mode in ("defaults", "defaults-cpu")
    flags: dict[str, object] = dict(accelerator="cpu" if on_cpu(mode) else "xla", devices=1)
    if mode == "lightning":
        flags = lightnings_own_xla_flags()
    if not defaults:
        flags.update(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(max_epochs=epochs, callbacks=[timing_callback(meter)], default_root_dir=root, **flags)
        module, loader = Module(), build(model)[1]
        meter.begin()
        trainer.fit(module, loader)


def lightnings_own_xla_flags() -> dict[str, object]:
    """Lightning's own XLA accelerator and strategy, with its TPU-only device count widened to PJRT CPU."""
    from lightning.fabric.accelerators import xla as fabric_xla
    from lightning.pytorch.accelerators import XLAAccelerator
    from lightning.pytorch.strategies import SingleDeviceXLAStrategy

    import trainer_plugins

    trainer_plugins.uninstall()
    for cache in (fabric_xla.XLAAccelerator.auto_device_count, fabric_xla.XLAAccelerator.is_available):
        cache.cache_clear()
    fabric_xla.XLAAccelerator.auto_device_count = staticmethod(lambda: 1)  # benchmark-only
    fabric_xla.XLAAccelerator.is_available = staticmethod(lambda: True)  # benchmark-only
    return dict(accelerator=XLAAccelerator(), strategy=SingleDeviceXLAStrategy(device=torch.device("xla", 0)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    meter = Meter(xla=not on_cpu(args.mode))
    run(args.mode, args.model, args.epochs, meter)
    print(json.dumps({"mode": args.mode, "model": args.model, **meter.summary()}))


if __name__ == "__main__":
    main()

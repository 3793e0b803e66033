"""What one steady-state training step does, counted (not timed), per loop, as JSON.

    python benchmarks/step_counts.py [--modes raw,plugin,lightning] [--model small] [--epochs 2]

Runs benchmarks/throughput.py's loops one after the other in this process and counts, over the
epochs after the first, per step:

* ``graphs_executed``: graphs torch_xla ran (``ExecuteComputation``), ``syncs``: ``torch_xla.sync``
  calls (``MarkStep``), ``compilations`` (``CompileTime`` samples);
* ``graph_nodes``: IR nodes of the graphs synced (torch_xla's ``TensorsGraphSize`` metric, summed);
* ``traced_ops``: tensor operations traced into the lazy graph (torch_xla's ``xla::*`` counters,
  summed; ``ops`` lists each), ``tensors_created`` (``CreateXlaTensor``);
* ``device_data_handles``: device buffers created (``CreateDataHandles``: uploads and graph outputs);
* ``transfers_to_device`` and ``transfers_from_device`` (``TransferToDeviceTime``/``TransferFromDeviceTime`` samples);
* ``python_calls``: Python function calls, by the package of the function called (``sys.setprofile``).
* ``counter_reads`` and ``metric_reads``: calls of torch_xla's ``_xla_counter_value`` and
  ``_xla_metric_data`` (the compile monitor's and the goodput ledger's reads, and any other's).

These counts do not depend on the machine's load. ``raw``, ``plugin`` and ``lightning`` mean what
they mean in throughput.py (``lightning`` last: it detaches the plugins from Lightning).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import throughput  # noqa: E402

OWNERS = ("xla_plugins", "trainer_plugins", "lightning", "torch_xla", "torch")
METRICS = {
    "compilations": "CompileTime",
    "transfers_to_device": "TransferToDeviceTime",
    "transfers_from_device": "TransferFromDeviceTime",
}
# Graphs executed by torch_xla's ExecuteComputation counter: the ExecuteTime metric's sample is taken
# on the execution thread and once missed a snapshot taken after torch_xla.sync(wait=True) (63 of 64)
COUNTERS = {
    "graphs_executed": "ExecuteComputation",
    "syncs": "MarkStep",
    "tensors_created": "CreateXlaTensor",
    "device_data_handles": "CreateDataHandles",
}


#: torch_xla's bindings that read its counters and metrics (the compile monitor's and the goodput ledger's reads)
READS = {"_xla_counter_value": "counter_reads", "_xla_metric_data": "metric_reads"}


def owner(filename: str) -> str:
    parts = Path(filename).parts
    return next((name for name in OWNERS if name in parts), "other")


def snapshot() -> Counter:
    import torch_xla.debug.metrics as met

    counts: Counter = Counter()
    for key, name in METRICS.items():
        data = met.metric_data(name)
        counts[key] = data[0] if data else 0
    graphs = met.metric_data("TensorsGraphSize")
    counts["graph_nodes"] = graphs[1] if graphs else 0
    for key, name in COUNTERS.items():
        counts[key] = met.counter_value(name) or 0
    for name in met.counter_names():
        if name.startswith("xla::"):
            counts["op " + name[5:]] = met.counter_value(name)
    return counts


class StepCounter(throughput.Meter):
    """throughput.Meter that also counts torch_xla's work and Python calls in the epochs after the first."""

    def __init__(self) -> None:
        super().__init__()
        self.total: Counter = Counter()
        self.calls: Counter = Counter()
        self.reads: Counter = Counter()
        self.steps = 0
        self._before: Counter = Counter()

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            self.calls[owner(frame.f_code.co_filename)] += 1
        elif event == "c_call" and getattr(arg, "__name__", "") in READS:
            self.reads[READS[arg.__name__]] += 1

    def start_epoch(self) -> None:
        super().start_epoch()
        if self.epochs:
            import torch_xla

            torch_xla.sync(wait=True)
            self._before = snapshot()
            sys.setprofile(self._profile)

    def end_epoch(self, steps: int) -> None:
        counting = bool(self.epochs)
        sys.setprofile(None)
        super().end_epoch(steps)  # waits for the epoch's last graph
        if counting:
            after = snapshot()
            after.subtract(self._before)
            self.total.update(after)
            self.steps += steps

    def summary(self) -> dict[str, Any]:  # type: ignore[override]
        per_step = {key: round(value / self.steps, 3) for key, value in sorted(self.total.items()) if value}
        # the epoch's closing sync (Meter.end_epoch) is one more, not the loop's
        per_step["syncs"] = round(per_step.get("syncs", 0) - len(self.epochs[1:]) / self.steps, 3)
        ops = {key[3:]: value for key, value in per_step.items() if key.startswith("op ")}
        counts = {key: value for key, value in per_step.items() if not key.startswith("op ")}
        calls = {key: round(value / self.steps, 1) for key, value in sorted(self.calls.items())}
        return {
            **counts,
            "graph_nodes_per_graph": round(counts.get("graph_nodes", 0) / max(counts.get("graphs_executed", 1), 1), 1),
            "traced_ops": round(sum(ops.values()), 3),
            "ops": ops,
            "python_calls": round(sum(calls.values()), 1),
            "python_calls_by_owner": calls,
            **{key: round(self.reads[key] / self.steps, 1) for key in READS.values()},
            "steps_counted": self.steps,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="raw,plugin,lightning")
    parser.add_argument("--model", choices=sorted(throughput.MODELS), default="small")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - {"raw", "plugin", "lightning"})
    if unknown:
        parser.error(f"--modes: {unknown} not among raw, plugin, lightning")
    if "lightning" in modes[:-1]:
        parser.error("--modes: lightning must come last (it detaches the plugins from Lightning)")
    report = {}
    for mode in modes:
        meter = StepCounter()
        throughput.run(mode, args.model, args.epochs, meter)
        report[mode] = meter.summary()
    print(json.dumps({"model": args.model, "per_step": report}))


if __name__ == "__main__":
    main()

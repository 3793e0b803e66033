"""Where a steady-state step's host time goes, by owner of the code, as JSON.

    python benchmarks/profile_step.py --mode raw|plugin|defaults|lightning [--model small]

Runs benchmarks/throughput.py's loop for three epochs under cProfile, profiling epochs 2 and 3
only (no compilation), and sums each function's own time (``tottime``) by the package it belongs
to: ``xla_plugins``, ``lightning``, ``torch_xla``, ``torch``, C functions (``built-in``: the
autograd engine, torch_xla's graph execution, ...) and the rest. Also prints Python function
calls per step. cProfile slows Python code down more than C code, so the shares overstate Python;
compare modes with each other, not with the unprofiled throughput.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import throughput  # noqa: E402

OWNERS = ("xla_plugins", "trainer_plugins", "lightning", "torch_xla", "torch")


def owner(filename: str) -> str:
    if filename.startswith("~") or filename.startswith("<built-in"):
        return "built-in (C)"
    parts = Path(filename).parts
    for name in OWNERS:
        if name in parts:
            return name
    return "other Python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=throughput.MODES, required=True)
    parser.add_argument("--model", choices=sorted(throughput.MODELS), default="small")
    args = parser.parse_args()
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    profiler = cProfile.Profile()
    meter = throughput.Meter(xla=not throughput.on_cpu(args.mode))
    start_epoch, end_epoch = meter.start_epoch, meter.end_epoch

    def start() -> None:
        start_epoch()
        if meter.epochs:
            profiler.enable()

    def end(steps: int) -> None:
        profiler.disable()
        end_epoch(steps)

    meter.start_epoch, meter.end_epoch = start, end  # type: ignore[method-assign]
    throughput.run(args.mode, args.model, 3, meter)
    steps = sum(epoch["steps"] for epoch in meter.epochs[1:])
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    seconds: dict[str, float] = defaultdict(float)
    calls = 0
    for (filename, _, _), (_, primitive_calls, own_time, _, _) in stats.items():
        seconds[owner(filename)] += own_time
        if not filename.startswith("~"):
            calls += primitive_calls
    total = sum(seconds.values())
    print(
        json.dumps(
            {
                "mode": args.mode,
                "model": args.model,
                "ms_per_step_profiled": 1000 * total / steps,
                "python_calls_per_step": calls / steps,
                "ms_per_step_by_owner": {k: round(1000 * v / steps, 3) for k, v in sorted(seconds.items())},
            }
        )
    )


if __name__ == "__main__":
    main()

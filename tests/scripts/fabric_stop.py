"""A Fabric loop on the spawn strategy (``"xla"``) told to stop by a real SIGTERM to its main process.

Through tests/xla_cpu_harness.py: the workers' replicas are threads of one process. The loop reads
``fabric.strategy.received_sigterm`` before each step; after step ``--signal-after`` rank 0 sends
SIGTERM to the main process (the worker's parent). Every replica writes ``rank<N>.json`` (the step
at which it saw the flag) before it saves ``--out/stop.ckpt`` and calls
``fabric.strategy.exit_after_stop()``; the main process should then exit with status 143.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import xla_cpu_harness  # noqa: E402

xla_cpu_harness.install()

import lightning as L  # noqa: E402
import torch  # noqa: E402


def run(fabric: L.Fabric, out: str, steps: int, signal_after: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    module, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(steps):
        if fabric.strategy.received_sigterm:
            with open(os.path.join(out, f"rank{fabric.global_rank}.json"), "w") as stream:
                json.dump({"step": step}, stream)
            fabric.save(os.path.join(out, "stop.ckpt"), {"model": module, "optimizer": optimizer, "step": step})
            fabric.strategy.exit_after_stop()
        generator = torch.Generator().manual_seed(step)
        batch = torch.randn(8, 4, generator=generator).to(fabric.device)
        fabric.backward(module(batch).square().mean())
        optimizer.step()
        optimizer.zero_grad()
        if step == signal_after and fabric.global_rank == 0:
            os.kill(os.getppid(), signal.SIGTERM)  # the main process, as a scheduler's preemption notice
    fabric.print("END-OF-LOOP")  # not reached: the stop ends the run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--signal-after", type=int, default=3)
    args = parser.parse_args()
    fabric = L.Fabric(accelerator="xla", strategy="xla", devices=args.devices)
    fabric.launch(run, args.out, args.steps, args.signal_after)


if __name__ == "__main__":
    main()

"""Per-device memory and speed of ``xla_fsdp_v2`` against ``xla_spmd`` on N PJRT CPU devices.

    python benchmarks/fsdp_memory.py [--devices 4] [--rounds 3] [--steps 20]

Both strategies fit the same MLP (four 1024x1024 layers, Adam) with the Trainer on the same data
and per-device batch. Each run is its own process; the rounds are interleaved (both strategies once
a round, the order alternating), so a change in the machine's load hits both alike. A run reports:

* per-device bytes of the parameters plus the optimizer state (Adam's ``exp_avg`` and
  ``exp_avg_sq``), read from the shards each device really holds
  (``torch_xla._XLAC._get_local_shards``), after training; the largest over the devices. Adam's
  ``step`` counters live on the CPU and are not counted, nor are gradients (freed after each step)
  and activations;
* optimizer steps per second over ``--steps`` steps after three warm-up steps (compilation).

Printed: one JSON line per run, then per strategy the median and ``[min-max]`` over the rounds,
and the ratios fsdp/spmd taken within each round, then their median and spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

STRATEGIES = ("xla_spmd", "xla_fsdp_v2")
WARMUP = 3
BATCH = 16  # per device
WIDTH = 1024


def device_bytes(tensors: list) -> dict[str, int]:
    """Bytes each device holds of ``tensors`` (XLA tensors only), by device name."""
    import torch_xla

    torch_xla.sync(wait=True)
    held: dict[str, int] = {}
    for tensor in tensors:
        if tensor.device.type != "xla":
            continue
        for shard, device in torch_xla._XLAC._get_local_shards([tensor])[0]:
            held[device] = held.get(device, 0) + shard.numel() * shard.element_size()
    return held


def one_run(strategy: str, steps: int) -> dict:
    import lightning as L
    import torch
    import torch_xla
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    devices = int(os.environ["CPU_NUM_DEVICES"])

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            layers: list[nn.Module] = []
            for _ in range(4):
                layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
            self.net = nn.Sequential(*layers, nn.Linear(WIDTH, 1))
            self.started = 0.0
            self.report: dict = {}

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def on_train_batch_start(self, batch, batch_idx) -> None:
            if batch_idx == WARMUP:
                torch_xla.sync(wait=True)
                self.started = time.perf_counter()

        def on_train_end(self) -> None:
            torch_xla.sync(wait=True)
            elapsed = time.perf_counter() - self.started
            optimizer = self.trainer.optimizers[0]
            states = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
            params = device_bytes(list(self.parameters()))
            total = device_bytes(list(self.parameters()) + states)
            self.report = {
                "strategy": strategy,
                "steps_per_s": steps / elapsed,
                "param_bytes_per_device": max(params.values()),
                "param_and_state_bytes_per_device": max(total.values()),
                "devices": len(total),
            }

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    L.seed_everything(0)
    size = BATCH * devices * (WARMUP + steps)
    x = torch.randn(size, WIDTH)
    loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=BATCH)
    model = Model()
    trainer = L.Trainer(
        accelerator="xla",
        devices="auto",
        strategy=strategy,
        max_steps=WARMUP + steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    return model.report


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.4g} [{min(values):.4g}-{max(values):.4g}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--one", choices=STRATEGIES, help=argparse.SUPPRESS)  # a single run, in this process
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_run(args.one, args.steps)))
        return
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(args.devices)}
    rounds: list[dict[str, dict]] = []
    for index in range(args.rounds):
        order = STRATEGIES if index % 2 == 0 else STRATEGIES[::-1]
        results: dict[str, dict] = {}
        for strategy in order:
            command = [sys.executable, __file__, "--one", strategy, "--steps", str(args.steps)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode != 0 or not lines:
                sys.exit(f"{strategy} failed ({done.returncode}):\n{done.stderr[-3000:]}")
            results[strategy] = json.loads(lines[-1][len("RESULT ") :])
            print(json.dumps({"round": index, **results[strategy]}), flush=True)
        rounds.append(results)
    for strategy in STRATEGIES:
        runs = [r[strategy] for r in rounds]
        held = spread([r["param_and_state_bytes_per_device"] for r in runs])
        print(
            f"{strategy}: params+optimizer state per device {held}"
            f" bytes, params {spread([r['param_bytes_per_device'] for r in runs])} bytes,"
            f" steps/s {spread([r['steps_per_s'] for r in runs])}"
        )
    memory = [
        r["xla_fsdp_v2"]["param_and_state_bytes_per_device"] / r["xla_spmd"]["param_and_state_bytes_per_device"]
        for r in rounds
    ]
    speed = [r["xla_fsdp_v2"]["steps_per_s"] / r["xla_spmd"]["steps_per_s"] for r in rounds]
    print(f"fsdp/spmd within a round: memory per device {spread(memory)}, steps/s {spread(speed)}")


if __name__ == "__main__":
    main()

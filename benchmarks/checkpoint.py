"""Step stall per checkpoint on single_xla: background write vs synchronous writes, as JSON and a table.

Each run (its own process) fits an MLP whose training state (weights and Adam's two moments) is
about 100 MB, and calls ``trainer.save_checkpoint`` every ``--every`` steps; the stall is the time
that call keeps the training thread (wall clock around it). Three arms: ``background`` (the
default, :class:`~xla_plugins.checkpoint_io.BackgroundXLACheckpointIO`), ``sync``
(``XLA_PLUGINS_CHECKPOINT_WRITES=sync``: the same atomic write on the training thread) and
``torch.save`` (Lightning's own ``XLACheckpointIO``: ``torch.save`` on the training thread). The
arms are interleaved over ``--rounds`` rounds (benchmarks/rounds.py); the ratio
background / torch.save is taken within a round, then its median.

    PJRT_DEVICE=CPU python benchmarks/checkpoint.py [--rounds 3] [--width 2048] [--saves 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from rounds import interleaved, run, spread

ARMS = {
    "background": {},
    "sync": {"XLA_PLUGINS_CHECKPOINT_WRITES": "sync"},
    "torch.save": {"CHECKPOINT_ARM": "lightning"},
}


def child(width: int, saves: int, every: int) -> dict:
    import lightning as L
    import torch
    from lightning.fabric.plugins import XLACheckpointIO
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(*(nn.Linear(width, width) for _ in range(2)))

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    stalls: list[float] = []
    directory = tempfile.mkdtemp(prefix="checkpoint-bench-")

    class Saves(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step % every == 0:
                started = time.perf_counter()
                trainer.save_checkpoint(os.path.join(directory, f"step{trainer.global_step}.ckpt"))
                stalls.append(time.perf_counter() - started)

    plugins = [XLACheckpointIO()] if os.environ.get("CHECKPOINT_ARM") == "lightning" else []
    trainer = L.Trainer(
        accelerator="xla",
        devices=1,
        strategy="single_xla",
        max_steps=every * (saves + 1),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Saves()],
        plugins=plugins,
    )
    model = MLP()
    data = DataLoader(TensorDataset(torch.randn(every * (saves + 1) * 8, width)), batch_size=8)
    started = time.perf_counter()
    trainer.fit(model, data)
    fit_s = time.perf_counter() - started
    size = os.path.getsize(os.path.join(directory, f"step{every}.ckpt"))
    kept = stalls[1:]  # the first save also compiles the host copy's graph
    return {
        "io": type(trainer.strategy.checkpoint_io).__name__,
        "checkpoint_mb": size / 1e6,
        "stall_ms": 1000 * statistics.median(kept),
        "stalls_ms": [round(1000 * s, 1) for s in stalls],
        "fit_s": fit_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.width, args.saves, args.every)))
        return
    flags = ["--child", "--width", str(args.width), "--saves", str(args.saves), "--every", str(args.every)]
    results = interleaved(list(ARMS), args.rounds, lambda arm: run("checkpoint.py", *flags, env=ARMS[arm]))
    report: dict = {"rounds": args.rounds, "arms": results}
    rows = []
    for arm, runs in results.items():
        good = [r for r in runs if "error" not in r]
        rows.append(f"| {arm} | {good[0]['io'] if good else 'n/a'} | {spread([r['stall_ms'] for r in good], 1)} |")
    base = {r["round"]: r["stall_ms"] for r in results["torch.save"] if "error" not in r}
    ratios = [
        r["stall_ms"] / base[r["round"]] for r in results["background"] if "error" not in r and r["round"] in base
    ]
    report["background_over_torch_save"] = ratios
    size = next((r["checkpoint_mb"] for runs in results.values() for r in runs if "error" not in r), float("nan"))
    print(f"checkpoint {size:.0f} MB; stall per save, ms, median [min-max] of {args.rounds} rounds", file=sys.stderr)
    print("| arm | checkpoint IO | stall (ms) |\n|---|---|---|\n" + "\n".join(rows), file=sys.stderr)
    print(f"background / torch.save: {spread(ratios, 3)}", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

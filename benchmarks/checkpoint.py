"""Step stall per checkpoint on single_xla: background writes vs synchronous writes, as JSON and a table.

Each run (its own process) fits an MLP whose training state (weights and Adam's two moments) is
about 100 MB, and calls ``trainer.save_checkpoint`` every ``--every`` steps; the stall is the time
that call keeps the training thread (wall clock around it), the first save (which also compiles)
left out. Four arms: ``background`` (the default,
:class:`~xla_plugins.checkpoint_io.BackgroundXLACheckpointIO` with ``copy="auto"``: on PJRT CPU
always a copy on the device, moved to the host by the writer thread), ``host-copy``
(``XLA_PLUGINS_CHECKPOINT_WRITES=host-copy``: the copy to the host on the training thread, the
default before 3 December 2026), ``sync`` (``XLA_PLUGINS_CHECKPOINT_WRITES=sync``:
the same atomic write on the training thread) and ``torch.save`` (Lightning's own
``XLACheckpointIO``: ``torch.save`` on the training thread). The arms are interleaved over
``--rounds`` rounds (benchmarks/rounds.py); each ratio to ``torch.save`` is taken within a round,
then its median.

Where a stall goes, per save: ``copy_ms``, the training thread's transfer of XLA tensors to the
host (torch_xla's ``_maybe_convert_to_cpu``, which first waits for the step still running on the
device), and ``wait_ms``, the wait for the previous write (one in flight). ``fit_s`` is the whole
fit: a writer thread that competes with training for the CPU shows there, not in the stall.

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
    "host-copy": {"XLA_PLUGINS_CHECKPOINT_WRITES": "host-copy"},
    "sync": {"XLA_PLUGINS_CHECKPOINT_WRITES": "sync"},
    "torch.save": {"CHECKPOINT_ARM": "lightning"},
}


def _timed_on_the_training_thread(owner: object, name: str, spent: list[float]) -> None:
    """Wrap ``owner.<name>`` so that its time on the main (training) thread adds up in ``spent[-1]``."""
    import threading

    original = getattr(owner, name)

    def timed(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return original(*args, **kwargs)
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[-1] += time.perf_counter() - started

    setattr(owner, name, timed)


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

    import torch_xla.core.xla_model as xm

    from xla_plugins.checkpoint_io import BackgroundXLACheckpointIO

    stalls: list[float] = []
    copies: list[float] = [0.0]
    waits: list[float] = [0.0]
    _timed_on_the_training_thread(xm, "_maybe_convert_to_cpu", copies)  # Lightning's and the plugin's transfer
    _timed_on_the_training_thread(BackgroundXLACheckpointIO, "wait", waits)
    directory = tempfile.mkdtemp(prefix="checkpoint-bench-")

    class Saves(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step % every == 0:
                copies[-1] = waits[-1] = 0.0
                started = time.perf_counter()
                trainer.save_checkpoint(os.path.join(directory, f"step{trainer.global_step}.ckpt"))
                stalls.append(time.perf_counter() - started)
                copies.append(0.0)
                waits.append(0.0)

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
    kept = slice(1, len(stalls))  # the first save also compiles the copy's graph
    return {
        "io": type(trainer.strategy.checkpoint_io).__name__,
        "checkpoint_mb": size / 1e6,
        "stall_ms": 1000 * statistics.median(stalls[kept]),
        "copy_ms": 1000 * statistics.median(copies[:-1][kept]),
        "wait_ms": 1000 * statistics.median(waits[:-1][kept]),
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
    base = {r["round"]: r["stall_ms"] for r in results["torch.save"] if "error" not in r}
    for arm, runs in results.items():
        good = [r for r in runs if "error" not in r]
        ratios = [r["stall_ms"] / base[r["round"]] for r in good if r["round"] in base]
        report[f"{arm}_over_torch_save"] = ratios
        figures = [spread([r[key] for r in good], 1) for key in ("stall_ms", "copy_ms", "wait_ms", "fit_s")]
        rows.append(f"| {arm} | {good[0]['io'] if good else 'n/a'} | {' | '.join(figures)} | {spread(ratios, 3)} |")
    size = next((r["checkpoint_mb"] for runs in results.values() for r in runs if "error" not in r), float("nan"))
    print(f"checkpoint {size:.0f} MB; per save, median [min-max] of {args.rounds} rounds", file=sys.stderr)
    header = "| arm | checkpoint IO | stall (ms) | of it, copy (ms) | of it, wait (ms) | fit (s) | stall / torch.save |"
    print(header + "\n|---|---|---|---|---|---|---|\n" + "\n".join(rows), file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

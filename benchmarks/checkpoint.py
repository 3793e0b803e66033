"""Step stall per checkpoint on single_xla: background writes vs synchronous writes, as JSON and a table.

Each run (its own process) fits an MLP whose training state (weights and Adam's two moments) is
about 100 MB: a warm-up save (it also compiles the copy's graph; left out), then ``--saves *
--every`` steps without a save, then as many steps with ``trainer.save_checkpoint`` every
``--every`` steps. Before each of those saves (and at the same steps of the window without saves)
the benchmark waits until the device has finished the step just dispatched
(``xm.wait_device_ops``), which the next step's dispatch would wait for anyway. Two figures a save:

* ``stall_ms``: the time the call keeps the training thread from there (wall clock around it,
  median of the saves): what the save blocks the step for.
* ``added_ms``: the window with saves minus the window without, over the number of saves: all the
  step time a save costs, the writer thread's work included. On PJRT CPU the device is the host's
  own cores, so a writer thread (the transfer, ``torch.save``, ``fsync``) competes with the steps
  for them; on TPU the steps run on the chip (not verified on TPU).

Four arms: ``background`` (the default,
:class:`~xla_plugins.checkpoints.checkpoint_io.BackgroundXLACheckpointIO` with ``copy="auto"``: on PJRT CPU
always a copy on the device, moved to the host by the writer thread), ``host-copy``
(``XLA_PLUGINS_CHECKPOINT_WRITES=host-copy``: the copy to the host on the training thread, the
default before 3 December 2026), ``sync`` (``XLA_PLUGINS_CHECKPOINT_WRITES=sync``: the same atomic
write on the training thread) and ``torch.save`` (Lightning's own ``XLACheckpointIO``:
``torch.save`` on the training thread). The arms are interleaved over ``--rounds`` rounds
(benchmarks/rounds.py); each ratio to ``torch.save`` is taken within a round, then its median.

Where a stall goes, per save: ``copy_ms``, the training thread's transfer of XLA tensors to the
host (torch_xla's ``_maybe_convert_to_cpu``), and ``wait_ms``, the wait for the previous write (one
in flight). ``step_ms`` is a step of the window without saves; ``fit_s`` the whole fit.

    PJRT_DEVICE=CPU python benchmarks/checkpoint.py [--rounds 3] [--width 2048] [--saves 6] [--every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from rounds import interleaved, run, spread, within_round_ratios

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

    from xla_plugins.checkpoints.checkpoint_io import BackgroundXLACheckpointIO

    calls: list[float] = []
    copies: list[float] = [0.0]
    waits: list[float] = [0.0]
    _timed_on_the_training_thread(xm, "_maybe_convert_to_cpu", copies)  # Lightning's and the plugin's transfer
    _timed_on_the_training_thread(BackgroundXLACheckpointIO, "wait", waits)
    directory = tempfile.mkdtemp(prefix="checkpoint-bench-")
    # Steps: a warm-up save at `every` (it also compiles the copy's graph), a window of
    # `saves * every` steps without a save from 2 * every, then a window as long with a save
    # every `every` steps from `first`. At every `every`-th step the callback first waits for the
    # device (and at the windows' ends for a write in flight), so that each save starts with no
    # step running, and both windows wait alike.
    first = (2 + saves) * every
    last = first + saves * every
    batch_ends: dict[int, float] = {}

    class Saves(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            step = trainer.global_step
            if step % every:
                return
            if step in (2 * every, last):
                getattr(trainer.strategy.checkpoint_io, "wait", lambda: None)()
            xm.wait_device_ops()
            batch_ends[step] = time.perf_counter()
            if step == every or first <= step < last:
                copies[-1] = waits[-1] = 0.0
                started = time.perf_counter()
                trainer.save_checkpoint(os.path.join(directory, f"step{step}.ckpt"))
                calls.append(time.perf_counter() - started)
                copies.append(0.0)
                waits.append(0.0)

    plugins = [XLACheckpointIO()] if os.environ.get("CHECKPOINT_ARM") == "lightning" else []
    trainer = L.Trainer(
        accelerator="xla",
        devices=1,
        strategy="single_xla",
        max_steps=last,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Saves()],
        plugins=plugins,
    )
    model = MLP()
    data = DataLoader(TensorDataset(torch.randn(last * 8, width)), batch_size=8)
    started = time.perf_counter()
    trainer.fit(model, data)
    fit_s = time.perf_counter() - started
    size = os.path.getsize(os.path.join(directory, f"step{every}.ckpt"))
    without_saves = batch_ends[first] - batch_ends[2 * every]
    with_saves = batch_ends[last] - batch_ends[first]
    kept = slice(1, len(calls))  # the warm-up save left out
    return {
        "io": type(trainer.strategy.checkpoint_io).__name__,
        "checkpoint_mb": size / 1e6,
        "stall_ms": 1000 * statistics.median(calls[kept]),
        "added_ms": 1000 * (with_saves - without_saves) / saves,
        "copy_ms": 1000 * statistics.median(copies[:-1][kept]),
        "wait_ms": 1000 * statistics.median(waits[:-1][kept]),
        "step_ms": 1000 * without_saves / (saves * every),
        "calls_ms": [round(1000 * c, 1) for c in calls],
        "fit_s": fit_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--saves", type=int, default=6)
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
    figures_of = ("stall_ms", "copy_ms", "wait_ms", "added_ms", "step_ms", "fit_s")
    for arm, runs in results.items():
        good = [r for r in runs if "error" not in r]
        ratios = {key: within_round_ratios(good, results["torch.save"], key) for key in ("stall_ms", "added_ms")}
        report[f"{arm}_over_torch_save"] = ratios
        figures = [spread([r[key] for r in good], 1) for key in figures_of]
        cells = " | ".join(figures + [spread(ratios["stall_ms"], 3), spread(ratios["added_ms"], 2)])
        rows.append(f"| {arm} | {good[0]['io'] if good else 'n/a'} | {cells} |")
    size = next((r["checkpoint_mb"] for runs in results.values() for r in runs if "error" not in r), float("nan"))
    print(f"checkpoint {size:.0f} MB; per save, median [min-max] of {args.rounds} rounds", file=sys.stderr)
    header = (
        "| arm | checkpoint IO | stall (ms) | of it, copy (ms) | of it, wait (ms) | step time added (ms)"
        " | step (ms) | fit (s) | stall / torch.save | added / torch.save |"
    )
    print(header + "\n|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows), file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

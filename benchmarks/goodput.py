"""Goodput of a run interrupted 3 times vs the same run uninterrupted, from the goodput ledger, as JSON and a table.

    PJRT_DEVICE=CPU python benchmarks/goodput.py [--rounds 3] [--steps 1200] [--width 512] [--seed 0]

One run: ``single_xla`` trains an MLP (``--width``) for ``--steps`` steps on random data, with
Lightning's default ``ModelCheckpoint`` and the goodput ledger on (its default); each process of
the run is a fresh interpreter. Three arms, interleaved over ``--rounds`` rounds (benchmarks/rounds.py):

* ``uninterrupted``: one process;
* ``3 stops (SIGTERM)``: the process sends itself SIGTERM at three points drawn once from ``--seed``
  (the same points in every round), the plugin writes its stop checkpoint, and each next process
  resumes with ``fit(ckpt_path="last")``: four processes;
* ``3 kills (SIGKILL)``: at the same points the process is killed with SIGKILL instead, with
  ``ModelCheckpoint(every_n_train_steps=--every, save_last=True)``; each next process resumes from
  the last periodic checkpoint and trains the steps after it again (lost work).

Every arm's ``ModelCheckpoint`` writes to one fixed folder of the run directory; an arm whose
ledger does not hold one attempt per process (a resume that found no checkpoint) is an error.

Each arm's figures are the run's ledger (``<run directory>/goodput/ledger.json``) after its last
process; the ratio of an interrupted arm's goodput to the uninterrupted one's is taken within a
round, then its median.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rounds import interleaved, spread

HERE = Path(__file__).parent
ARMS = {"uninterrupted": None, "3 stops (SIGTERM)": "SIGTERM", "3 kills (SIGKILL)": "SIGKILL"}


def child(root: str, steps: int, width: int, stop_at: int, stop_signal: str, every: int, resume: bool) -> None:
    """One process of a run: fit until ``steps`` (resuming from "last" if ``resume``), signalled at ``stop_at``."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
            )

        def training_step(self, batch, batch_idx):
            if self.global_step == stop_at:
                os.kill(os.getpid(), getattr(signal, stop_signal))
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64 * 32, 64), torch.randint(0, 10, (64 * 32,)))
    # a fixed dirpath: after a SIGKILL there is no stop checkpoint, and "last" finds the periodic last.ckpt
    # only in ModelCheckpoint's own folder (with the default logger's, new on every process, it would not)
    folder = os.path.join(root, "checkpoints")
    checkpoint = (
        ModelCheckpoint(folder, every_n_train_steps=every, save_last=True) if every else ModelCheckpoint(folder)
    )
    trainer = L.Trainer(
        accelerator="xla",
        devices=1,
        strategy="single_xla",
        max_steps=steps,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoint],
    )
    trainer.fit(MLP(), DataLoader(data, batch_size=32, shuffle=True), ckpt_path="last" if resume else None)


def points(steps: int, seed: int) -> list[int]:
    """The three global steps at which the interrupted arms are interrupted (sorted, inside the run)."""
    return sorted(random.Random(seed).sample(range(steps // 10, steps - steps // 10), 3))


def measure(arm: str, args: argparse.Namespace) -> dict:
    """Run the arm's processes in a new run directory; its ledger's figures (or ``{"error": ...}``)."""
    from trainer_plugins._goodput_record import read_ledger

    stop_signal = ARMS[arm]
    stops = points(args.steps, args.seed) if stop_signal else []
    every = args.every if stop_signal == "SIGKILL" else 0
    root = tempfile.mkdtemp(prefix="goodput-bench-")
    started = time.perf_counter()
    for index, stop_at in enumerate([*stops, -1]):
        flags = [str(args.steps), str(args.width), str(stop_at), stop_signal or "SIGTERM", str(every), str(index > 0)]
        command = [sys.executable, str(HERE / "goodput.py"), "--child", root, *flags]
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PJRT_DEVICE": "CPU"})
        expected = 0 if stop_at < 0 else 143 if stop_signal == "SIGTERM" else -9
        if result.returncode != expected:
            tail = result.stderr.strip().splitlines()[-1:] or [f"exit {result.returncode}"]
            return {"error": f"process {index + 1}: exit {result.returncode}: {tail[0]}"}
    ledger = read_ledger(root)
    if len(ledger.attempts) != len(stops) + 1:
        return {
            "error": f"the ledger holds {len(ledger.attempts)} attempts for {len(stops) + 1} processes: a resume"
            " did not find its checkpoint"
        }
    totals = ledger.totals()
    return {
        "goodput": ledger.goodput(),
        "attempts": len(ledger.attempts),
        "steps": ledger.steps,
        "lost_steps": ledger.lost_steps,
        "seconds": {name: round(value, 3) for name, value in totals.items()},
        "processes_s": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--every", type=int, default=100, help="periodic checkpoint interval of the SIGKILL arm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        root, steps, width, stop_at, stop_signal, every, resume = args.child
        child(root, int(steps), int(width), int(stop_at), stop_signal, int(every), resume == "True")
        return
    results = interleaved(list(ARMS), args.rounds, lambda arm: measure(arm, args))
    base = {r["round"]: r["goodput"] for r in results["uninterrupted"] if "error" not in r}
    report: dict = {
        "rounds": args.rounds,
        "steps": args.steps,
        "points": points(args.steps, args.seed),
        "arms": results,
    }
    names = ("productive", "startup", "compilation", "checkpoint_save", "checkpoint_restore", "lost", "wall")
    print(
        f"{args.steps} steps, interrupted at {report['points']}; median [min-max] of {args.rounds} rounds",
        file=sys.stderr,
    )
    print(
        "| arm | goodput | vs uninterrupted | " + " | ".join(f"{n} (s)" for n in names) + " | lost steps |",
        file=sys.stderr,
    )
    print("|---" * (len(names) + 4) + "|", file=sys.stderr)
    for arm, runs in results.items():
        good = [r for r in runs if "error" not in r]
        ratios = [r["goodput"] / base[r["round"]] for r in good if r["round"] in base]
        report[f"{arm} / uninterrupted"] = ratios
        cells = [spread([100 * r["goodput"] for r in good], 1, "%"), spread(ratios, 2)]
        cells += [spread([r["seconds"][n] for r in good], 1) for n in names]
        cells.append(spread([float(r["lost_steps"]) for r in good], 0))
        print(f"| {arm} | " + " | ".join(cells) + " |", file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

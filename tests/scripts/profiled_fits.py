"""Fits on XLA under each of Lightning's profilers, with the plugin's listeners on and off, for tests/test_profiler.py.

    python profiled_fits.py [--strategy single_xla] [--profilers simple,advanced,pytorch,xla]

For each profiler (``simple``, ``advanced``, ``pytorch``: Lightning's ``SimpleProfiler``,
``AdvancedProfiler`` and ``PyTorchProfiler`` writing their report to a file; ``xla``: Lightning's
``XLAProfiler``, which writes no report) x optimization (``automatic``, ``manual``) x listeners
(``on``: the defaults, compile monitor and goodput ledger; ``off``: ``XLA_PLUGINS_GOODPUT=off
XLA_PLUGINS_RECOMPILES=off``), one ``fit`` of a small model in this process. Prints one JSON line,
by ``"<profiler> <optimization> <on|off>"``: ``listeners``, how many listeners of the profiler's
actions the run had (``trainer_plugins.action_listeners`` at ``on_train_start``), and ``report``,
what the report holds that does not depend on timing:

* ``simple``: each action's row and its number of calls;
* ``advanced``: each action with a "Profile stats" section (cProfile counts no calls per action), as 1;
* ``pytorch``: each row of Lightning's recorded functions (names starting ``[pl]``: its actions and
  the module's layers) and its calls;
* ``xla``: the step numbers the profiler gave each evaluation step action (its ``StepTrace`` count).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import tempfile
from pathlib import Path

import lightning as L
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.profilers import AdvancedProfiler, PyTorchProfiler, SimpleProfiler, XLAProfiler

from trainer_plugins import action_listeners

OPTIMIZATIONS = ("automatic", "manual")
SWITCHES = {"on": {}, "off": {"XLA_PLUGINS_GOODPUT": "off", "XLA_PLUGINS_RECOMPILES": "off"}}


class Manual(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = self.step(batch)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


class Listeners(L.Callback):
    """Counts the listeners of the trainer's profiler actions once training starts."""

    count = -1

    def on_train_start(self, trainer, pl_module):
        self.count = len(action_listeners(trainer))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def make_profiler(name: str, folder: str):
    if name == "simple":
        return SimpleProfiler(dirpath=folder, filename="report")
    if name == "advanced":
        return AdvancedProfiler(dirpath=folder, filename="report")
    if name == "pytorch":
        return PyTorchProfiler(
            dirpath=folder,
            filename="report",
            export_to_chrome=False,
            row_limit=-1,  # every row, not the 20 slowest
            table_kwargs={"max_name_column_width": 200},  # whole names
        )
    if name == "xla":
        return XLAProfiler(port=free_port())
    raise ValueError(f"profiler {name!r}: choose simple, advanced, pytorch or xla")


def report_of(name: str, profiler, folder: str) -> dict[str, int]:
    if name == "xla":
        return dict(profiler._step_recoding_map)
    text = "".join(path.read_text() for path in sorted(Path(folder).glob("*report*")))
    if name == "simple":
        rows = [
            [cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines() if "|" in line
        ]
        header = next(row for row in rows if "Num calls" in row)
        column = header.index("Num calls")
        return {row[0]: int(row[column]) for row in rows if row is not header and row[column].isdigit()}
    if name == "advanced":
        return {action: 1 for action in re.findall(r"^Profile stats for: (.+?)(?: rank: \d+)?$", text, re.M)}
    # torch's key_averages table: a column of names as wide as its first run of dashes, the calls last
    width = len(next(line for line in text.splitlines() if line.startswith("---")).split()[0])
    rows = (line for line in text.splitlines() if line[:width].strip().startswith("[pl]"))
    return {row[:width].strip(): int(row.split()[-1]) for row in rows}


def fit(strategy: str, name: str, optimization: str, switch: str) -> dict:
    saved = {variable: os.environ.get(variable) for variable in SWITCHES["off"]}
    os.environ.update(SWITCHES[switch])
    try:
        with tempfile.TemporaryDirectory() as folder:
            L.seed_everything(0)
            model = Manual() if optimization == "manual" else BoringModel()
            profiler, listeners = make_profiler(name, folder), Listeners()
            trainer = L.Trainer(
                accelerator="tpu",
                devices=1,
                strategy=strategy,
                max_epochs=2,
                limit_train_batches=3,
                limit_val_batches=2,
                logger=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                enable_checkpointing=False,
                default_root_dir=folder,
                profiler=profiler,
                callbacks=[listeners],
            )
            trainer.fit(model)
            return {"listeners": listeners.count, "report": report_of(name, profiler, folder)}
    finally:
        for variable, value in saved.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="single_xla")
    parser.add_argument("--profilers", default="simple,advanced,pytorch,xla")
    args = parser.parse_args()
    results = {
        f"{name} {optimization} {switch}": fit(args.strategy, name, optimization, switch)
        for name in args.profilers.split(",")
        for optimization in OPTIMIZATIONS
        for switch in SWITCHES
    }
    sys.stdout.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()

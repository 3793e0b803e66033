"""The GPT workload of examples/gpt_stdlib.py on PJRT CPU: raw torch_xla loop, plugin Trainer, Lightning's XLA classes.

    python benchmarks/gpt.py [--rounds 3] [--epochs 3] [--steps 10]     # every run below, interleaved rounds
    python benchmarks/gpt.py --mode raw|plugin|lightning --strategy single_xla|xla_spmd|xla_fsdp_v2 [--scan-layers]
                             [--cache DIR]                              # one run, as JSON on the last line

Runs (strategy, loop): ``single_xla`` with ``raw``, ``plugin`` and ``lightning``; ``xla_spmd`` and
``xla_fsdp_v2`` on 4 PJRT CPU devices (``CPU_NUM_DEVICES=4``) with ``raw`` and ``plugin``
(Lightning's Trainer has no SPMD strategy of its own).

* ``raw``: a hand-written torch_xla loop (``.to(device)``, ``zero_grad``, forward, ``backward``,
  ``step``, ``torch_xla.sync()``); on ``xla_spmd`` the batch is sharded over a 1-D mesh
  (``torch_xla.distributed.spmd.mark_sharding``), on ``xla_fsdp_v2`` the model is wrapped whole in
  torch_xla's ``SpmdFullyShardedDataParallel`` and the batch is sharded over its ``"fsdp"`` axis.
* ``plugin``: ``lightning.Trainer(accelerator="tpu", strategy=...)`` through xla-plugins.
* ``lightning``: Lightning's own ``XLAAccelerator`` and ``SingleDeviceXLAStrategy``, with their
  TPU-only device count widened to the PJRT CPU device (benchmarks/throughput.py's
  ``lightnings_own_xla_flags``).

Every run: the same model (``GPTConfig`` defaults: 4 layers, width 128, 4 heads, 128 bytes of
context, tied embeddings), the same data (the standard library's bytes, ``StdlibBytes``), AdamW
(lr 2e-3), float32, a global batch of :data:`GLOBAL_BATCH` windows (per device ``GLOBAL_BATCH /
devices`` for the Trainer, whose loader batch is per device), and a quiet loop (no progress bar,
logger, checkpointing, model summary or ``self.log``). An epoch is ``--steps`` steps; steady state
leaves the first epoch out (compilation). Time to first step runs from the start of the loop
(``fit``, or the raw loop's first line) to the end of the first step's execution. Compilations and
their seconds are torch_xla's ``CompileTime`` metric; peak memory is the process's peak RSS (all
devices of PJRT CPU live in it). ``tied_in_loop`` and ``tied_after`` say whether the output layer
shares the token embedding's weight when training starts and after the run (the raw loop re-ties
after its own move, as Lightning's XLA strategies do); ``losses`` is every step's training loss,
read after the timing.

Each run is its own process, so that compilation caches and peak memory are its own; ratios
(``plugin`` / ``lightning``, ``plugin`` / ``raw``) are taken within a round (benchmarks/rounds.py's
helpers) before their median is taken.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

import throughput  # noqa: E402
from gpt_stdlib import GPT, GPTConfig, GPTModule, StdlibBytes, adamw, lm_loss  # noqa: E402
from rounds import interleaved, run, spread, within_round_ratios  # noqa: E402

GLOBAL_BATCH = 16
LEARNING_RATE = 2e-3
WEIGHT_DECAY = 0.1
#: devices of each strategy
DEVICES = {"single_xla": 1, "xla_spmd": 4, "xla_fsdp_v2": 4}
#: (strategy, loop) of every run of a round
RUNS = (
    ("single_xla", "raw"),
    ("single_xla", "plugin"),
    ("single_xla", "lightning"),
    ("xla_spmd", "raw"),
    ("xla_spmd", "plugin"),
    ("xla_fsdp_v2", "raw"),
    ("xla_fsdp_v2", "plugin"),
)


#: the Trainer's flags of the quiet loop
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


class QuietGPTModule(GPTModule):
    """:class:`GPTModule` without ``self.log``: the Trainer does the raw loop's work on the device."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return lm_loss(self.model, *batch)


def run_raw(strategy: str, config: GPTConfig, epochs: int, steps: int, meter: throughput.Meter) -> dict[str, Any]:
    """The hand-written torch_xla loop on ``strategy``'s devices; returns the tie and the losses."""
    import torch._dynamo  # noqa: F401  (imported before the clock, as Lightning's import does for the Trainer)
    import torch_xla

    meter.begin()
    if strategy != "single_xla":
        import numpy as np
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()  # before the first XLA tensor
        axis = "fsdp" if strategy == "xla_fsdp_v2" else "data"
        mesh = xs.Mesh(np.arange(DEVICES[strategy]), (DEVICES[strategy],), (axis,))
    device = torch_xla.device()
    torch.manual_seed(0)
    gpt = GPT(config).to(device)
    gpt.tie_weights()  # the move gave the output layer a parameter of its own
    model: torch.nn.Module = gpt
    if strategy == "xla_fsdp_v2":
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

        model = SpmdFullyShardedDataParallel(gpt, mesh=mesh)
    optimizer = adamw(model, LEARNING_RATE, WEIGHT_DECAY)
    data = StdlibBytes(config.block_size, GLOBAL_BATCH)
    losses = []
    for _ in range(epochs):
        meter.start_epoch()
        for step, (x, y) in zip(range(steps), data.train_dataloader(), strict=False):
            x, y = x.to(device), y.to(device)
            if strategy != "single_xla":
                xs.mark_sharding(x, mesh, (axis, None))
                xs.mark_sharding(y, mesh, (axis, None))
            optimizer.zero_grad()
            loss = lm_loss(model, x, y)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            torch_xla.sync()
            if step == 0:
                meter.first_step_done()
        meter.end_epoch(steps)
    return {"tied_in_loop": gpt.tied, "tied_after": gpt.tied, "losses": losses}


def run_trainer(
    mode: str,
    strategy: str,
    config: GPTConfig,
    epochs: int,
    steps: int,
    meter: throughput.Meter,
    quiet: bool = True,
    callbacks: tuple[Any, ...] = (),
) -> dict[str, Any]:
    """``fit`` with the plugin's Trainer (``mode="plugin"``) or Lightning's own XLA classes (``"lightning"``).

    ``quiet=False``: the Trainer's defaults (logger, checkpoints, progress bar, model summary) in
    place of the quiet loop; ``callbacks``: more of the Trainer's callbacks.
    """
    import lightning as L

    losses: list[torch.Tensor] = []
    tied_in_loop: list[bool] = []

    class Losses(L.Callback):
        def on_train_start(self, trainer, pl_module):
            tied_in_loop.append(pl_module.model.tied)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(outputs["loss"])

    flags: dict[str, object] = dict(accelerator="tpu", strategy=strategy, devices=DEVICES[strategy])
    if mode == "lightning":
        flags = throughput.lightnings_own_xla_flags()
    torch.manual_seed(0)
    module = QuietGPTModule(lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, **asdict(config))
    loader = StdlibBytes(config.block_size, GLOBAL_BATCH // DEVICES[strategy]).train_dataloader()
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(
            max_epochs=epochs,
            limit_train_batches=steps,
            callbacks=[throughput.timing_callback(meter), Losses(), *callbacks],
            default_root_dir=root,
            **(QUIET if quiet else {}),
            **flags,
        )
        meter.begin()
        trainer.fit(module, loader)
    return {"tied_in_loop": all(tied_in_loop), "tied_after": module.model.tied, "losses": losses}


def measure(
    mode: str, strategy: str, config: GPTConfig, epochs: int, steps: int, cache: str | None = None
) -> dict[str, Any]:
    """One run's figures (see the module's docstring); ``cache``: torch_xla's persistent compilation cache folder."""
    if cache is not None:
        import torch_xla.runtime as xr

        xr.initialize_cache(cache, readonly=False)
    meter = throughput.Meter()
    if mode == "raw":
        outcome = run_raw(strategy, config, epochs, steps, meter)
    else:
        outcome = run_trainer(mode, strategy, config, epochs, steps, meter)
    figures = meter.summary()  # before the losses are read: reading them must not count
    figures["tokens_per_s"] = figures["steps_per_s"] * GLOBAL_BATCH * config.block_size
    figures["steps_per_epoch"] = [int(epoch["steps"]) for epoch in meter.epochs]
    return {
        "mode": mode,
        "strategy": strategy,
        **figures,
        "tied_in_loop": outcome["tied_in_loop"],
        "tied_after": outcome["tied_after"],
        "losses": [float(loss) for loss in outcome["losses"]],
    }


def child_env(strategy: str) -> dict[str, str]:
    """The environment of a run on ``strategy``: PJRT CPU with its device count."""
    return {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(DEVICES[strategy])}


def table(results: dict[str, list[dict]]) -> list[str]:
    """One row per run label: figures as ``median [min-max]``, ``vs raw`` taken within each round."""
    lines = [
        "| strategy | loop | steps/s | tokens/s | vs raw | compilations: epoch 1 / later | compile s"
        " | first step s | peak RSS MiB | tied in loop / after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, runs in results.items():
        strategy, loop = label.split(" ")
        good = [f for f in runs if "error" not in f]
        if not good:
            lines.append(f"| {strategy} | {loop} | failed: {runs[0].get('error')} |" + " |" * 7)
            continue
        compiles = sorted({f"{c[0]} / {sum(c[1:])}" for c in (f["compiles_per_epoch"] for f in good)})
        lines.append(
            f"| {strategy} | {loop} | {spread([f['steps_per_s'] for f in good], 2)}"
            f" | {spread([f['tokens_per_s'] for f in good], 0)}"
            f" | {spread(within_round_ratios(good, results[f'{strategy} raw']), 2, 'x')}"
            f" | {', '.join(compiles)} | {spread([f['compile_s'] for f in good], 1)}"
            f" | {spread([f['first_step_s'] for f in good], 1)} | {spread([f['peak_rss_mib'] for f in good], 0)}"
            f" | {'/'.join(sorted({str(f['tied_in_loop']) for f in good}))}"
            f" / {'/'.join(sorted({str(f['tied_after']) for f in good}))} |"
        )
    return lines


def report(rounds: int, epochs: int = 3, steps: int = 10, n_layer: int = 4, scan_layers: bool = False) -> list[str]:
    """Every run of :data:`RUNS` in ``rounds`` interleaved rounds, each its own process: the lines to print."""

    def one(label: str) -> dict:
        strategy, mode = label.split(" ")
        options = ["--epochs", str(epochs), "--steps", str(steps), "--n-layer", str(n_layer)]
        options += ["--scan-layers"] if scan_layers else []
        figures = run("gpt.py", "--mode", mode, "--strategy", strategy, *options, env=child_env(strategy))
        figures.pop("losses", None)
        return figures

    results = interleaved([f"{strategy} {mode}" for strategy, mode in RUNS], rounds, one)
    ratio = within_round_ratios(results["single_xla plugin"], results["single_xla lightning"])
    return [
        f"GPT on the standard library's bytes ({n_layer} layers{', scan_layers' if scan_layers else ''}): median"
        f" [min-max] of {rounds} interleaved rounds; {steps} steps an epoch, steady state = epochs 2-{epochs};"
        f" global batch {GLOBAL_BATCH} x {GPTConfig.block_size} bytes.",
        *table(results),
        "",
        f"`plugin` / `lightning` on single_xla within each round: {spread(ratio, 2, 'x')}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mode", choices=("raw", "plugin", "lightning"), help="one run (default: every run, in rounds)"
    )
    parser.add_argument("--strategy", choices=sorted(DEVICES), default="single_xla")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3, help="epochs a run; the first is left out (compilation)")
    parser.add_argument("--steps", type=int, default=10, help="steps an epoch")
    parser.add_argument("--n-layer", type=int, default=GPTConfig.n_layer)
    parser.add_argument("--scan-layers", action="store_true", help="run the blocks with torch_xla's scan_layers")
    parser.add_argument("--cache", help="torch_xla's persistent compilation cache folder (one run only)")
    args = parser.parse_args()
    config = GPTConfig(n_layer=args.n_layer, scan_layers=args.scan_layers)
    if args.mode is not None:
        if args.mode == "lightning" and args.strategy != "single_xla":
            parser.error("--mode lightning: Lightning's Trainer has no SPMD strategy; use --strategy single_xla")
        for name, value in child_env(args.strategy).items():
            os.environ.setdefault(name, value)
        print(json.dumps(measure(args.mode, args.strategy, config, args.epochs, args.steps, args.cache)))
        return

    print("\n".join(report(args.rounds, args.epochs, args.steps, args.n_layer, args.scan_layers)))


if __name__ == "__main__":
    main()

"""What the plugin's listeners (compile monitor, goodput ledger) cost a real model's step: on vs off, interleaved.

    python benchmarks/listeners.py [--rounds 9] [--epochs 3] [--steps 20] [--n-layer 2] [--quiet] [--processes]
    python benchmarks/listeners.py --listeners on|off [--profile] ...      # one run, as JSON on the last line

Each run is benchmarks/gpt.py's ``plugin`` run on ``single_xla`` (the GPT byte LM of
examples/gpt_stdlib.py on PJRT CPU), with the Trainer's defaults (logger, checkpoints, progress bar,
model summary; ``--quiet``: gpt.py's quiet loop): ``on`` with the listeners at their defaults,
``off`` with ``XLA_PLUGINS_GOODPUT=off XLA_PLUGINS_RECOMPILES=off``. All fits run in one process
after one fit that compiles the graphs (``--processes``: each in its own process). Steps/s is the
steady state (epochs 2 and later); ``on`` / ``off`` is taken within each round
(benchmarks/rounds.py), and the rounds below 1.0 are counted.

Beside the wall clock, each fit's loop thread's CPU time per steady-state step (``time.thread_time``
in throughput.Meter): the listeners run in that thread, while PJRT CPU computes the step in its
own threads, so the difference between ``on`` and ``off`` is their Python work, and a loaded
machine (other processes taking the cores) stretches it far less than it stretches wall time. It
is reported as the difference within each round (ms a step) and as the ratio off / on of the
loop thread's CPU time (below 1.0: the listeners cost). The CPU time of all the process's threads
(``time.process_time``: the loop's and PJRT CPU's computation of the steps) and the device-to-host
transfers a step (torch_xla's ``TransferFromDeviceTime`` count) say whether the listeners changed
the device's work.

``--profile``: one untimed run under cProfile during its second epoch; prints the calls per step
by package (``trainer_plugins``, ``xla_plugins``, all), the reads of torch_xla's metrics per step
(``_XLAC`` counter and metric reads: ``counter_value``, ``metric_data`` and the rest) and the
costliest functions of the two packages. The report mode runs one profiled run of each after the rounds.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from rounds import interleaved, run, spread, within_round, within_round_ratios  # noqa: E402

#: the environment of each setting
SETTINGS = {"on": {}, "off": {"XLA_PLUGINS_GOODPUT": "off", "XLA_PLUGINS_RECOMPILES": "off"}}
#: packages whose Python calls a step are counted
PACKAGES = ("trainer_plugins", "xla_plugins")


def profiler_callback(profile: cProfile.Profile, steps: list[int]) -> Any:
    """A Lightning callback running ``profile`` over the second training epoch, counting its steps in ``steps``."""
    import lightning as L

    class Profiled(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                profile.enable()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.current_epoch == 1:
                steps[0] += 1

        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                profile.disable()

    return Profiled()


def replay_callback(figures: dict[str, Any], repeats: int = 30, steps: int = 100) -> Any:
    """A Lightning callback that times one step's profiler boundaries, replayed, at the end of the second epoch.

    It records the names of the trainer's profiler actions started and stopped in the second
    training epoch, cuts one step's cycle (from one fetch of a batch to the next: balanced, the epoch
    still open), and at the epoch's end replays it ``steps`` times through ``trainer.profiler`` (with
    the listeners on: the core's wrapper, the monitor's reads, the ledger's handlers and its stamp;
    off: Lightning's PassThroughProfiler), ``repeats`` times, each timed in the thread's CPU time
    (``time.thread_time``: the time other processes hold the cores is not counted); the fastest repeat
    is the one a busy machine disturbed least. Writes ``replay_us_per_step`` (that time over ``steps``) and
    ``replay_boundaries_per_step`` into ``figures``. Not replayed: Lightning's own calls around each
    boundary (the same on and off, but for the dispatch of the monitor's own callback hooks) and the
    read methods' wrapper (counted by ``--profile``).
    """
    import time

    import lightning as L

    fetch = "[_TrainingEpochLoop].train_dataloader_next"

    class Replay(L.Callback):
        def __init__(self) -> None:
            self.heard: list[tuple[bool, str]] = []
            self.saved: dict[str, Any] = {}

        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch != 1:
                return
            profiler = trainer.profiler
            self.saved = {name: profiler.__dict__.get(name) for name in ("start", "stop")}
            start, stop = profiler.start, profiler.stop

            def recorded_start(action_name: str) -> None:
                self.heard.append((True, action_name))
                start(action_name)

            def recorded_stop(action_name: str) -> None:
                self.heard.append((False, action_name))
                stop(action_name)

            profiler.start, profiler.stop = recorded_start, recorded_stop

        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch != 1:
                return
            profiler = trainer.profiler
            for name, saved in self.saved.items():
                if saved is None:
                    profiler.__dict__.pop(name, None)
                else:
                    profiler.__dict__[name] = saved
            starts = [i for i, (started, name) in enumerate(self.heard) if started and name == fetch]
            cycle = self.heard[starts[1] : starts[2]]  # the second step's: the first one's fetch began the epoch
            start, stop = profiler.start, profiler.stop
            best = float("inf")
            for _ in range(repeats):
                began = time.thread_time()
                for _ in range(steps):
                    for started, name in cycle:
                        (start if started else stop)(name)
                best = min(best, time.thread_time() - began)
            figures["replay_us_per_step"] = round(best / steps * 1e6, 2)
            figures["replay_boundaries_per_step"] = len(cycle)

    return Replay()


def per_step(profile: cProfile.Profile, steps: int) -> dict[str, Any]:
    """Calls per step by package, torch_xla metric reads per step (and their us a step), our costliest functions.

    cProfile's times are wall time: a function that runs while PJRT CPU's threads compute the step
    on the same cores is charged for the wait, so the times show where the host waited, not only
    what a function costs; the calls are exact.
    """
    stats = pstats.Stats(profile).stats  # {(file, line, name): (primitive calls, calls, tottime, cumtime, callers)}
    calls = {package: 0 for package in PACKAGES}
    reads: dict[str, float] = {}
    ours: dict[str, float] = {}
    total = 0
    for (file, line, name), (_, ncalls, tottime, _, _) in stats.items():
        total += ncalls
        for package in PACKAGES:
            if f"/{package}/" in file:
                calls[package] += ncalls
                ours[f"{package}{file.split(package, 1)[1]}:{line}({name})"] = tottime
        if "_XLAC" in name and ("counter" in name or "metric" in name):
            reads[name] = ncalls / steps
            reads[f"{name} us"] = round(tottime / steps * 1e6, 1)
    costliest = sorted(ours.items(), key=lambda item: -item[1])[:8]
    return {
        "steps": steps,
        "calls_per_step": {package: count / steps for package, count in calls.items()} | {"all": total / steps},
        "metric_reads_per_step": reads,
        "costliest_us_per_step": {name: round(seconds / steps * 1e6, 1) for name, seconds in costliest},
    }


def one_run(
    listeners: str, epochs: int, steps: int, n_layer: int, quiet: bool, profiled: bool, replayed: bool = False
) -> dict[str, Any]:
    """One ``fit`` (see the module docstring); the environment already holds ``listeners``'s setting.

    ``replayed``: with :func:`replay_callback`'s figures (its replay runs after the second epoch's timing).
    """
    import gpt
    import throughput

    config = gpt.GPTConfig(n_layer=n_layer)
    meter = throughput.Meter()
    profile, counted = cProfile.Profile(), [0]
    replayed_figures: dict[str, Any] = {}
    callbacks = (profiler_callback(profile, counted),) if profiled else ()
    callbacks += (replay_callback(replayed_figures),) if replayed else ()
    gpt.run_trainer("plugin", "single_xla", config, epochs, steps, meter, quiet=quiet, callbacks=callbacks)
    summary = meter.summary()
    figures: dict[str, Any] = {
        "listeners": listeners,
        "steps_per_s": summary["steps_per_s"],
        "cpu_ms_per_step": summary["loop_thread_cpu_ms_per_step"],
        "process_cpu_ms_per_step": summary["process_cpu_ms_per_step"],
        "transfers_per_step": summary["transfers_per_step"],
    }
    if profiled:
        figures |= per_step(profile, counted[0])
    return figures | replayed_figures


def fits_in_this_process(rounds: int, epochs: int, steps: int, n_layer: int, quiet: bool) -> dict[str, list[dict]]:
    """``rounds`` interleaved rounds of ``on`` and ``off`` fits in this process, after one fit left out.

    The first fit compiles the graphs; the later ones find them in torch_xla's in-memory cache, so
    each fit is seconds and a round's two fits are close in time (this machine's load changes less
    between them than between two fresh processes).
    """
    os.environ.setdefault("PJRT_DEVICE", "CPU")

    def one(label: str) -> dict:
        saved = {name: os.environ.get(name) for name in SETTINGS["off"]}
        os.environ.update(SETTINGS[label])
        try:
            return one_run(label, epochs, steps, n_layer, quiet, False)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    one("on")  # compiles
    return interleaved(list(SETTINGS), rounds, one)


def report(rounds: int, epochs: int, steps: int, n_layer: int, quiet: bool, processes: bool) -> list[str]:
    """``rounds`` interleaved rounds of ``on`` and ``off``, then one profiled run of each: the lines to print.

    ``processes``: each fit in its own process (its compilation included, left out of the steady
    state); otherwise all fits in one process (:func:`fits_in_this_process`).
    """
    options = ["--epochs", str(epochs), "--steps", str(steps), "--n-layer", str(n_layer)]
    options += ["--quiet"] if quiet else []

    def one(label: str, *more: str) -> dict:
        return run("listeners.py", "--listeners", label, *options, *more, env=SETTINGS[label])

    if processes:
        results = interleaved(list(SETTINGS), rounds, one)
    else:
        results = fits_in_this_process(rounds, epochs, steps, n_layer, quiet)
    where = "a process a fit" if processes else "all fits in one process, the first left out"
    ratios = within_round_ratios(results["on"], results["off"])
    below, trainer = sum(r < 1 for r in ratios), "quiet loop" if quiet else "defaults"
    cpu_added = within_round(results["on"], results["off"], lambda on, off: on - off, "cpu_ms_per_step")
    cpu_ratios = within_round(results["on"], results["off"], lambda on, off: off / on, "cpu_ms_per_step")
    all_added = within_round(results["on"], results["off"], lambda on, off: on - off, "process_cpu_ms_per_step")
    lines = [
        f"GPT byte LM ({n_layer} layers) on single_xla, PJRT CPU, the Trainer's {trainer};"
        f" {steps} steps an epoch, steady state = epochs 2-{epochs};"
        f" median [min-max] of {rounds} interleaved rounds ({where}).",
        "| listeners | steps/s |",
        "|---|---|",
        *(
            f"| {label} | {spread([f['steps_per_s'] for f in runs if 'error' not in f], 2)} |"
            for label, runs in results.items()
        ),
        "",
        f"on / off within each round: {spread(ratios, 3, 'x')}; rounds below 1.0: {below} of {len(ratios)}",
        f"ratios by round: {', '.join(f'{r:.3f}' for r in ratios)}",
        "",
        "| listeners | loop thread's CPU ms a step |",
        "|---|---|",
        *(
            f"| {label} | {spread([f['cpu_ms_per_step'] for f in runs if 'error' not in f], 2)} |"
            for label, runs in results.items()
        ),
        "",
        f"loop thread's CPU, on - off within each round: {spread(cpu_added, 3, ' ms')} a step;"
        f" off / on: {spread(cpu_ratios, 4, 'x')}; rounds where on took more: {sum(d > 0 for d in cpu_added)}"
        f" of {len(cpu_added)}",
        f"all threads' CPU (the loop's and PJRT CPU's computation), on - off within each round:"
        f" {spread(all_added, 3, ' ms')} a step; rounds where on took more: {sum(d > 0 for d in all_added)}"
        f" of {len(all_added)}",
        *(
            f"device-to-host transfers a step, {label}:"
            f" {sorted({f['transfers_per_step'] for f in runs if 'error' not in f})}"
            for label, runs in results.items()
        ),
    ]
    replays = {label: [one(label, "--replay") for _ in range(3)] for label in SETTINGS}
    for label, runs in replays.items():
        timed = [f["replay_us_per_step"] for f in runs if "replay_us_per_step" in f]
        boundaries = {f.get("replay_boundaries_per_step") for f in runs}
        lines.append(
            f"replayed boundaries of one step, {label}: {spread(timed, 1, ' us')} a step (fastest of 30 repeats"
            f" of 100 steps, in each of 3 processes; {boundaries} boundaries a step)"
        )
    for label in SETTINGS:
        profiled = one(label, "--profile")
        profiled.pop("steps_per_s", None)
        for figure in ("cpu_ms_per_step", "process_cpu_ms_per_step", "transfers_per_step"):
            profiled.pop(figure, None)
        lines.append(f"profiled, {label}: {json.dumps(profiled)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listeners", choices=sorted(SETTINGS), help="one run (default: interleaved rounds of both)")
    parser.add_argument("--profile", action="store_true", help="one run: count calls per step under cProfile")
    parser.add_argument("--replay", action="store_true", help="one run: time one step's profiler boundaries, replayed")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--epochs", type=int, default=3, help="epochs a run; the first is left out (compilation)")
    parser.add_argument("--steps", type=int, default=20, help="steps an epoch")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--quiet", action="store_true", help="gpt.py's quiet loop instead of the Trainer's defaults")
    parser.add_argument("--processes", action="store_true", help="each fit in a fresh process (default: one process)")
    args = parser.parse_args()
    if args.listeners is not None:
        for name, value in SETTINGS[args.listeners].items():
            os.environ.setdefault(name, value)
        os.environ.setdefault("PJRT_DEVICE", "CPU")
        figures = one_run(args.listeners, args.epochs, args.steps, args.n_layer, args.quiet, args.profile, args.replay)
        print(json.dumps(figures))
        return
    print("\n".join(report(args.rounds, args.epochs, args.steps, args.n_layer, args.quiet, args.processes)))


if __name__ == "__main__":
    main()

"""Run every benchmark of docs/performance.md in one go and print the figures with their spread.

    tox -e bench        # or: python benchmarks/run_all.py [--rounds 3] [--epochs 12] [--skip-multidevice] [--skip-gpt]

Throughput, compilations, transfers, time to first step and peak memory come from
benchmarks/throughput.py, one process per mode, model and round. Rounds are interleaved (every
mode once per round, in a rotated order), so that a change in the machine's load hits all modes
alike; each figure is the median over the rounds with its min-max, and each ratio (to the raw loop
on the same device, and between two Trainer modes) and each difference in milliseconds a step is
taken within a round before its median is taken. The ``*-cpu`` modes run the raw loop and the
Trainer on torch's CPU device: what Lightning's loop costs where neither XLA nor a plugin is
involved. Each run trains ``--epochs`` epochs of 64 steps and leaves the first out. Start-up costs
come from benchmarks/startup.py, multi-device throughput from benchmarks/multidevice.py, the real
model's (a GPT on the standard library's bytes) from benchmarks/gpt.py; the step's
counts and phases (docs/performance.md) from benchmarks/step_counts.py and benchmarks/step_phases.py,
run on their own.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gpt
from rounds import by_round, interleaved, run, spread, within_round_added_ms, within_round_ratios

HERE = Path(__file__).parent
#: mode label -> (throughput.py mode, extra environment)
MODES: dict[str, tuple[str, dict[str, str]]] = {
    "raw": ("raw", {}),
    "plugin": ("plugin", {}),
    "defaults": ("defaults", {}),
    "defaults-eager": ("defaults", {"XLA_PLUGINS_METRIC_READS": "eager"}),
    "lightning": ("lightning", {}),
    "raw-cpu": ("raw-cpu", {}),
    "trainer-cpu": ("trainer-cpu", {}),
    "defaults-cpu": ("defaults-cpu", {}),
}


def baseline(label: str) -> str:
    """The raw loop a mode is compared with: on its own device (XLA, or torch's CPU for ``*-cpu``)."""
    return "raw-cpu" if label.endswith("-cpu") else "raw"


def throughput(models: list[str], rounds: int, epochs: int) -> dict[str, dict[str, list[dict]]]:
    """``{model: {mode: [figures of each round]}}``, rounds interleaved, the order rotated each round."""
    labels = [f"{model} {mode}" for model in models for mode in MODES]

    def measure(label: str) -> dict:
        model, mode_label = label.split(" ")
        mode, env = MODES[mode_label]
        return run("throughput.py", "--mode", mode, "--model", model, "--epochs", str(epochs), env=env)

    flat = interleaved(labels, rounds, measure)
    return {model: {mode: flat[f"{model} {mode}"] for mode in MODES} for model in models}


def throughput_table(results: dict[str, dict[str, list[dict]]]) -> list[str]:
    lines = [
        "| model | loop | steps/s | vs raw | compilations: epoch 1 / later epochs | transfers per step"
        " | first step s | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, modes in results.items():
        for label, runs in modes.items():
            good = [f for f in runs if "error" not in f]
            if not good:
                lines.append(f"| {model} | {label} | failed: {runs[0].get('error')} | | | | | |")
                continue
            ratios = within_round_ratios(good, modes[baseline(label)])
            # torch's CPU device (the *-cpu modes) has no compilation or transfer to count (None): "-"
            compiles = sorted(
                {"-" if c is None else f"{c[0]} / {sum(c[1:])}" for c in (f["compiles_per_epoch"] for f in good)}
            )
            transfers = [f["transfers_per_step"] for f in good]
            lines.append(
                f"| {model} | {label} | {spread([f['steps_per_s'] for f in good])}"
                f" | {spread(ratios, 2, 'x')} | {', '.join(compiles)}"
                f" | {'-' if transfers[0] is None else spread(transfers, 3)}"
                f" | {spread([f['first_step_s'] for f in good], 2)}"
                f" | {spread([f['peak_rss_mib'] for f in good], 0)} |"
            )
    return lines


#: Pairs of Trainer modes compared within each round: (numerator, denominator).
PAIRS = (("defaults", "plugin"), ("defaults-cpu", "trainer-cpu"), ("defaults-eager", "plugin"), ("plugin", "lightning"))
#: What a Trainer adds to a step, within each round: (mode, the mode it adds to).
ADDED = (
    ("plugin", "raw"),
    ("lightning", "raw"),
    ("trainer-cpu", "raw-cpu"),
    ("defaults", "plugin"),
    ("defaults-cpu", "trainer-cpu"),
)


def pair_table(results: dict[str, dict[str, list[dict]]]) -> list[str]:
    """Ratios between two modes of the same round (median [min-max] over the rounds)."""
    lines = ["| model | " + " | ".join(f"`{a}` / `{b}`" for a, b in PAIRS) + " |", "|---|" + "---|" * len(PAIRS)]
    for model, modes in results.items():
        cells = [spread(within_round_ratios(modes[a], modes[b]), 2, "x") for a, b in PAIRS]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return lines


def added_table(results: dict[str, dict[str, list[dict]]]) -> list[str]:
    """Milliseconds a step that one mode adds to another of the same round (median [min-max] over the rounds).

    The last column applies what Lightning's quiet loop adds on torch's CPU device to the XLA raw
    loop's step of the same round: the ratio to ``raw`` the quiet XLA Trainer would reach if it added
    no more than Lightning's loop does where no plugin is involved.
    """
    header = " | ".join(f"`{a}` - `{b}`" for a, b in ADDED)
    lines = [f"| model | {header} | raw / (raw + (`trainer-cpu` - `raw-cpu`)) |", "|---|" + "---|" * (len(ADDED) + 1)]
    for model, modes in results.items():
        cells = [spread(within_round_added_ms(modes[a], modes[b]), 2, " ms") for a, b in ADDED]
        cpu, cpu_raw = by_round(modes["trainer-cpu"]), by_round(modes["raw-cpu"])
        bound = [
            1 / (1 + steps * (1 / cpu[r] - 1 / cpu_raw[r]))
            for r, steps in by_round(modes["raw"]).items()
            if r in cpu and r in cpu_raw
        ]
        lines.append(f"| {model} | " + " | ".join(cells) + f" | {spread(bound, 2, 'x')} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="small,wide")
    parser.add_argument("--epochs", type=int, default=12, help="epochs a run; the first is left out (compilation)")
    parser.add_argument("--skip-multidevice", action="store_true")
    parser.add_argument("--skip-startup", action="store_true")
    parser.add_argument("--skip-gpt", action="store_true", help="leave out benchmarks/gpt.py's real model")
    args = parser.parse_args()

    results = throughput(args.models.split(","), args.rounds, args.epochs)
    print(f"Throughput: median [min-max] of {args.rounds} interleaved rounds; steady state = epochs 2-{args.epochs}.")
    print("\n".join(throughput_table(results)))
    print()
    print("Ratios of two modes within each round:")
    print("\n".join(pair_table(results)))
    print()
    print("Milliseconds a step one mode adds to another within each round:")
    print("\n".join(added_table(results)))
    print()
    if not args.skip_multidevice:
        print("| devices | spawn 'xla' samples/s | SPMD 'xla_spmd' samples/s |")
        print("|---|---|---|")
        for devices in (2, 4):
            figures: dict[str, list[float]] = {"xla": [], "xla_spmd": []}
            for _ in range(args.rounds):
                for strategy in figures:
                    result = run("multidevice.py", "--strategy", strategy, "--devices", str(devices))
                    if "error" not in result:
                        figures[strategy].append(result["samples_per_s"])
            print(f"| {devices} | {spread(figures['xla'], 0)} | {spread(figures['xla_spmd'], 0)} |")
        print()
    if not args.skip_gpt:
        print("\n".join(gpt.report(args.rounds)))
        print()
    if args.skip_startup:
        return
    startup = run("startup.py")
    if "error" in startup:
        print(f"start-up benchmark failed: {startup['error']}")
        return
    print("| start-up | median [min-max] |")
    print("|---|---|")
    for label, key in (
        ("interpreter start-up (`python -c pass`)", "interpreter_ms"),
        ("site-packages processed, `trainer_plugins.pth` present", "with_pth_ms"),
        ("site-packages processed, `trainer_plugins.pth` absent", "without_pth_ms"),
        ("`python -c 'import trainer_plugins'`", "import_trainer_plugins_ms"),
        ("... plus plugin discovery (`get_catalog()`)", "discovery_ms"),
        ("`trainer-plugins list`", "list_command_ms"),
        ("`trainer-plugins doctor` (XLA plugin blocked)", "doctor_without_backend_ms"),
        ("`trainer-plugins explain --accelerator cpu`", "explain_cpu_command_ms"),
        ("`python -c 'import lightning'`", "import_lightning_ms"),
        ("first `Trainer(accelerator='cpu')` of a process, with plugins", "first_with_plugins_ms"),
        ("first `Trainer(accelerator='cpu')` of a process, plain Lightning", "first_plain_lightning_ms"),
        ("`Trainer(accelerator='cpu')`, with plugins", "with_plugins_ms"),
        ("`Trainer(accelerator='cpu')`, plain Lightning", "plain_lightning_ms"),
    ):
        value = startup.get(key)
        if value is None:
            continue
        print(f"| {label} | {spread(value, 1, ' ms') if isinstance(value, list) else f'{value:.1f} ms'} |")
    added = [a - b for a, b in zip(startup["with_pth_ms"], startup["without_pth_ms"], strict=True)]
    print(f"| added by the hook (present minus absent, paired runs) | {spread(added, 2, ' ms')} |")
    print(f"| modules imported at start-up (of torch, lightning, pluggy) | {startup['modules_imported_at_startup']} |")
    print(f"| start-up module loaded from cached bytecode | {startup['hook_bytecode_cached']} |")


if __name__ == "__main__":
    main()

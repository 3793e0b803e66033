"""What torch_xla offers against compile time, measured on the GPT workload (benchmarks/gpt.py's runs).

    python benchmarks/compile_time.py cache                      # the persistent compilation cache
    python benchmarks/compile_time.py scan [--rounds 3] [--runs "single_xla raw,xla_spmd plugin"] [--n-layer 4]

``cache``: two processes in a row run benchmarks/gpt.py's raw loop on ``single_xla`` with
``torch_xla.runtime.initialize_cache(folder, readonly=False)`` on the same new folder. The first
compiles and writes its executables; the second should read them back instead of compiling. Prints
for each process its compilations and their seconds (torch_xla's ``CompileTime``), its time to first
step, the files in the folder after it, whether it failed, and the lines of its stderr that mention
the cache, deserialization or an error, as they were printed.

``scan``: benchmarks/gpt.py's runs with the transformer blocks in a Python loop (``loop``) and through
``torch_xla.experimental.scan_layers.scan_layers`` (``scan``), each run its own process, rounds
interleaved. Prints per run and layout: compilations, compile seconds, time to first step, steps/s,
peak RSS; within each round, ``scan`` / ``loop`` of compile seconds and of steps/s, and the largest
difference between the two loss curves (every step's training loss, same seed and data).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from gpt import child_env  # noqa: E402
from rounds import interleaved, run, spread, within_round, within_round_ratios  # noqa: E402

#: stderr lines worth showing from a cached run (case-insensitive)
CACHE_WORDS = ("cache", "serializ", "error", "traceback")
#: gpt.py runs compared by default: (strategy, loop)
SCAN_RUNS = ("single_xla raw", "single_xla plugin", "xla_spmd plugin", "xla_fsdp_v2 plugin")


def cache(epochs: int, steps: int) -> None:
    """Run the raw loop twice on one persistent cache folder and print what each process did."""
    with tempfile.TemporaryDirectory() as folder:
        for attempt in ("first process (empty cache)", "second process (same cache)"):
            figures = run(
                "gpt.py",
                *("--mode", "raw", "--strategy", "single_xla", "--epochs", str(epochs), "--steps", str(steps)),
                *("--cache", folder),
                env=child_env("single_xla"),
                keep_stderr=True,
            )
            files = [path for path in Path(folder).rglob("*") if path.is_file()]
            print(f"## {attempt}")
            if "error" in figures:
                print(f"failed: {figures['error']}")
            else:
                print(
                    f"compilations {figures['compiles']}, {figures['compile_s']:.2f} s compiling,"
                    f" first step {figures['first_step_s']:.2f} s, steady {figures['steps_per_s']:.2f} steps/s"
                )
            print(f"cache folder: {len(files)} files, {sum(path.stat().st_size for path in files)} bytes")
            lines = [line for line in figures["stderr"].splitlines() if any(w in line.lower() for w in CACHE_WORDS)]
            print(f"stderr lines mentioning {', '.join(CACHE_WORDS)}: {len(lines)}")
            for line in lines[:20]:
                print(f"    {line}")
            print()


def scan(labels: list[str], rounds: int, epochs: int, steps: int, n_layer: int) -> None:
    """Interleaved rounds of ``labels`` (gpt.py runs), each with a loop and with scan_layers; print the table."""

    def measure(label: str) -> dict:
        strategy, mode, layout = label.split(" ")
        options = ["--epochs", str(epochs), "--steps", str(steps), "--n-layer", str(n_layer)]
        options += ["--scan-layers"] if layout == "scan" else []
        return run("gpt.py", "--mode", mode, "--strategy", strategy, *options, env=child_env(strategy))

    results = interleaved([f"{label} {layout}" for label in labels for layout in ("loop", "scan")], rounds, measure)
    print(
        f"scan_layers on the GPT ({n_layer} layers): median [min-max] of {rounds} interleaved rounds;"
        f" {steps} steps an epoch, steady state = epochs 2-{epochs}."
    )
    print(
        "| run | layout | compilations | compile s | first step s | steps/s | peak RSS MiB"
        " | scan / loop: compile s | scan / loop: steps/s | max loss difference |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label in labels:
        loop, scanned = results[f"{label} loop"], results[f"{label} scan"]
        for layout, runs in (("loop", loop), ("scan", scanned)):
            good = [f for f in runs if "error" not in f]
            if not good:
                print(f"| {label} | {layout} | failed: {runs[0].get('error')} |" + " |" * 7)
                continue
            comparison = " | | |"
            if layout == "scan":
                difference = within_round(
                    good, loop, lambda a, b: max(abs(x - y) for x, y in zip(a, b, strict=True)), "losses"
                )
                comparison = (
                    f" | {spread(within_round_ratios(good, loop, 'compile_s'), 2, 'x')}"
                    f" | {spread(within_round_ratios(good, loop), 2, 'x')} | {spread(difference, 7)} |"
                )
            print(
                f"| {label} | {layout} | {', '.join(sorted({str(f['compiles']) for f in good}))}"
                f" | {spread([f['compile_s'] for f in good], 1)} | {spread([f['first_step_s'] for f in good], 1)}"
                f" | {spread([f['steps_per_s'] for f in good], 2)} | {spread([f['peak_rss_mib'] for f in good], 0)}"
                + comparison
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("cache", "scan"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3, help="epochs a run; the first is left out (compilation)")
    parser.add_argument("--steps", type=int, default=10, help="steps an epoch")
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--runs", default=",".join(SCAN_RUNS), help="gpt.py runs as 'strategy loop', comma-separated")
    args = parser.parse_args()
    if args.what == "cache":
        cache(args.epochs, args.steps)
    else:
        scan(args.runs.split(","), args.rounds, args.epochs, args.steps, args.n_layer)


if __name__ == "__main__":
    main()

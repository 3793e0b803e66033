"""Run every benchmark of docs/performance.md in one go and print the figures with their ratios.

    tox -e bench                      # or: python benchmarks/run_all.py [--markdown]

Throughput, compilations, transfers and peak memory come from benchmarks/throughput.py (one
process per mode and model, so each has its own caches and memory peak); start-up costs from
benchmarks/startup.py. Every ratio compares figures measured in this same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
MODES = ("raw", "plugin", "lightning")


def run(script: str, *args: str) -> dict:
    env = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}
    result = subprocess.run([sys.executable, str(HERE / script), *args], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        return {
            "error": result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}"
        }
    return json.loads(result.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print markdown tables for docs/performance.md")
    args = parser.parse_args()

    rows = []
    for model in ("small", "wide"):
        results = {mode: run("throughput.py", "--mode", mode, "--model", model) for mode in MODES}
        raw = results["raw"]
        for mode in MODES:
            figures = results[mode]
            if "error" in figures:
                rows.append(f"| {model} | {mode} | failed: {figures['error']} | | | | |")
                continue
            speed, memory = figures["steps_per_s"], figures["peak_rss_mib"]
            rows.append(
                f"| {model} | {mode} | {speed:.1f} | {speed / raw['steps_per_s']:.2f}x"
                f" | {figures['compiles_per_epoch']} | {figures['transfers_per_step']:.2f}"
                f" | {memory:.0f} ({memory / raw['peak_rss_mib']:.2f}x) |"
            )
    spread = []
    for devices in (2, 4):
        results = {
            strategy: run("multidevice.py", "--strategy", strategy, "--devices", str(devices))
            for strategy in ("xla", "xla_spmd")
        }
        if any("error" in figures for figures in results.values()):
            spread.append(f"| {devices} | failed: {results} | | |")
            continue
        spawn, spmd = results["xla"]["samples_per_s"], results["xla_spmd"]["samples_per_s"]
        spread.append(f"| {devices} | {spawn:.0f} | {spmd:.0f} | {spmd / spawn:.2f}x |")
    startup = run("startup.py")

    header = "| model | loop | steps/s | vs raw | compilations per epoch | transfers per step | peak RSS MiB (vs raw) |"
    print(header)
    print("|" + "---|" * 7)
    print("\n".join(rows))
    print()
    print("| devices | spawn 'xla' samples/s | SPMD 'xla_spmd' samples/s | SPMD vs spawn |")
    print("|---|---|---|---|")
    print("\n".join(spread))
    print()
    if "error" in startup:
        print(f"start-up benchmark failed: {startup['error']}")
        return
    added = startup["interpreter_ms"] - startup["interpreter_without_hook_ms"]
    lines = [
        ("interpreter start-up, hook armed", f"{startup['interpreter_ms']:.1f} ms"),
        ("interpreter start-up, TRAINER_PLUGINS_AUTOLOAD=0", f"{startup['interpreter_without_hook_ms']:.1f} ms"),
        ("added by the hook", f"{added:.1f} ms"),
        ("modules imported at start-up (of torch, lightning, pluggy)", startup["modules_imported_at_startup"]),
        ("`python -c 'import trainer_plugins'`", f"{startup['import_trainer_plugins_ms']:.1f} ms"),
        ("... plus plugin discovery (`get_catalog()`)", f"{startup['discovery_ms']:.1f} ms"),
        ("`trainer-plugins list`", f"{startup['list_command_ms']:.1f} ms"),
        ("first `Trainer(accelerator='cpu')` of a process, with plugins", f"{startup['first_with_plugins_ms']:.0f} ms"),
        (
            "first `Trainer(accelerator='cpu')` of a process, plain Lightning",
            f"{startup['first_plain_lightning_ms']:.0f} ms",
        ),
        ("`Trainer(accelerator='cpu')`, with plugins", f"{startup['with_plugins_ms']:.2f} ms"),
        ("`Trainer(accelerator='cpu')`, plain Lightning", f"{startup['plain_lightning_ms']:.2f} ms"),
    ]
    print("| start-up | median |")
    print("|---|---|")
    for label, value in lines:
        print(f"| {label} | {value} |")
    if not args.markdown:
        print(json.dumps(startup))


if __name__ == "__main__":
    main()

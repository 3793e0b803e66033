"""Helpers every benchmark of this folder shares: a script run in its own process, and interleaved rounds summarised.

A figure is a median with its min-max over rounds; a ratio or a difference between two runs is
taken within a round (both runs saw the same load) before its median is taken.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent


def run(script: str, *args: str, env: dict[str, str] | None = None, keep_stderr: bool = False) -> dict:
    """The JSON that ``script`` (a benchmark of this folder) prints last, or ``{"error": its last stderr line}``.

    ``keep_stderr``: add the whole of its stderr as ``"stderr"``.
    """
    environ = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU"), **(env or {})}
    result = subprocess.run([sys.executable, str(HERE / script), *args], env=environ, capture_output=True, text=True)
    kept = {"stderr": result.stderr} if keep_stderr else {}
    if result.returncode != 0:
        last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}"
        return {"error": last, **kept}
    return {**json.loads(result.stdout.splitlines()[-1]), **kept}


def spread(values: list[float], digits: int = 1, unit: str = "") -> str:
    """``median [min-max]`` of ``values``."""
    if not values:
        return "n/a"
    return f"{statistics.median(values):.{digits}f}{unit} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def interleaved(labels: list[str], rounds: int, measure: Callable[[str], dict]) -> dict[str, list[dict]]:
    """``{label: [figures of each round]}``: ``measure(label)`` for every label once a round.

    The order is rotated by one label each round, so that a change in the machine's load hits
    every label alike; each figures dict gets its ``"round"`` (0-based) and is echoed to stderr.
    """
    results: dict[str, list[dict]] = {label: [] for label in labels}
    for round_index in range(rounds):
        for label in labels[round_index % len(labels) :] + labels[: round_index % len(labels)]:
            figures = measure(label)
            figures["round"] = round_index
            results[label].append(figures)
            print(f"round {round_index + 1} {label}: {json.dumps(figures)}", file=sys.stderr)
    return results


def by_round(runs: list[dict], key: str = "steps_per_s") -> dict[int, float]:
    """The figure ``key`` (default steps/s) of each good run of ``runs``, by its round."""
    return {f["round"]: f[key] for f in runs if "error" not in f}


def within_round(
    runs: list[dict], baselines: list[dict], compare: Callable[[float, float], float], key: str = "steps_per_s"
) -> list[float]:
    """``compare(figure of a run, figure of the baselines run of its round)`` for each run of ``runs``.

    The figure is ``key`` (default steps/s). Failed runs, and runs whose round has no good baseline
    run, are left out.
    """
    base = by_round(baselines, key)
    return [compare(value, base[r]) for r, value in by_round(runs, key).items() if r in base]


def within_round_ratios(runs: list[dict], baselines: list[dict], key: str = "steps_per_s") -> list[float]:
    """The figure ``key`` (default steps/s) of each run of ``runs`` over that of the ``baselines`` run of its round."""
    return within_round(runs, baselines, lambda run, base: run / base, key)


def within_round_added_ms(runs: list[dict], baselines: list[dict]) -> list[float]:
    """Milliseconds a step of each run of ``runs`` takes beyond a step of the ``baselines`` run of its round."""
    return within_round(runs, baselines, lambda run, base: 1000 / run - 1000 / base)

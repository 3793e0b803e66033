"""Start-up costs, as JSON: interpreter start with and without the auto-registration hook,
``import trainer_plugins``, ``trainer-plugins list``/``doctor``/``explain`` (against ``import
lightning``), and ``Trainer(...)`` construction with our
connector vs plain Lightning on ``accelerator="cpu"``. Medians of repeated runs (milliseconds).

The hook's cost is measured against the ``.pth`` file being absent, not merely switched off
(``TRAINER_PLUGINS_AUTOLOAD=0`` still reads the file and imports its module): both arms start
``python -S`` and process a site-packages folder with ``site.addsitedir``, the real one, or a
mirror of it (symbolic links to every entry) without ``trainer_plugins.pth``. The arms alternate,
run by run, and the report keeps every pair.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 25


def wall_ms(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    return (time.perf_counter() - started) * 1000


def median_ms(command: list[str], runs: int = RUNS, **overrides: str) -> float:
    env = {**os.environ, **overrides}
    wall_ms(command, env)  # warm the page cache and write bytecode
    return statistics.median(wall_ms(command, env) for _ in range(runs))


CONSTRUCTION = """
import json, statistics, time, warnings
warnings.simplefilter("ignore")
import lightning as L

def build():
    started = time.perf_counter()
    L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    return (time.perf_counter() - started) * 1000

first = build()
print(json.dumps({"first": first, "steady": statistics.median(build() for _ in range(30))}))
"""


def construction_ms() -> dict[str, float]:
    """``Trainer(accelerator="cpu")`` construction, first and steady, in fresh processes with and without plugins.

    The first construction in a process includes Lightning's own TPU check, which imports torch_xla
    when it is installed, with or without plugins; with plugins it also includes plugin discovery.
    """
    figures = {}
    for label, autoload in (("with_plugins", "1"), ("plain_lightning", "0")):
        env = {**os.environ, "TRAINER_PLUGINS_AUTOLOAD": autoload}
        result = subprocess.run(
            [sys.executable, "-c", CONSTRUCTION], env=env, capture_output=True, text=True, check=True
        )
        timing = json.loads(result.stdout.splitlines()[-1])
        figures[f"first_{label}_ms"], figures[f"{label}_ms"] = timing["first"], timing["steady"]
    return figures


def hook_pairs(runs: int = RUNS) -> tuple[list[float], list[float]]:
    """Start-up times (ms) with ``trainer_plugins.pth`` present and absent, in alternating runs."""
    real = next(Path(folder) for folder in site.getsitepackages() if (Path(folder) / "trainer_plugins.pth").exists())
    with tempfile.TemporaryDirectory() as mirror:
        for entry in real.iterdir():
            if entry.name != "trainer_plugins.pth":
                os.symlink(entry, Path(mirror) / entry.name)
        arms = [
            [sys.executable, "-S", "-c", f"import site; site.addsitedir({str(folder)!r})"] for folder in (real, mirror)
        ]
        env = {**os.environ, "TRAINER_PLUGINS_AUTOLOAD": "1"}
        for command in arms:
            wall_ms(command, env)  # warm the page cache
        present: list[float] = []
        absent: list[float] = []
        for _ in range(runs):
            present.append(wall_ms(arms[0], env))
            absent.append(wall_ms(arms[1], env))
    return present, absent


def hook_bytecode_cached() -> bool:
    """Whether the start-up module has bytecode the interpreter can load instead of compiling its source.

    Read from the ``.pyc`` header (its source's modification time and size, or a hash-based ``.pyc``).
    Without it (``PYTHONDONTWRITEBYTECODE=1`` and an installer that does not compile, as on this
    project's machine), every interpreter compiles the module at start: the hook costs more.
    """
    import importlib.util

    spec = importlib.util.find_spec("_trainer_plugins_autoload")
    if spec is None or spec.origin is None:
        return False
    cached = Path(importlib.util.cache_from_source(spec.origin))
    if not cached.exists():
        return False
    header = cached.read_bytes()[:16]
    if int.from_bytes(header[4:8], "little"):  # hash-based .pyc
        return True
    source = Path(spec.origin).stat()
    return header[8:16] == (int(source.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (
        source.st_size & 0xFFFFFFFF
    ).to_bytes(4, "little")


def main() -> None:
    python = [sys.executable, "-c", "pass"]
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; print(sorted(m for m in ('torch', 'lightning', 'pluggy') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    cli = shutil.which("trainer-plugins", path=os.path.dirname(sys.executable)) or "trainer-plugins"
    with_pth, without_pth = hook_pairs()
    report = {
        "interpreter_ms": median_ms(python, TRAINER_PLUGINS_AUTOLOAD="1"),
        "with_pth_ms": with_pth,
        "without_pth_ms": without_pth,
        "modules_imported_at_startup": imported,
        "hook_bytecode_cached": hook_bytecode_cached(),
        "import_trainer_plugins_ms": median_ms([sys.executable, "-c", "import trainer_plugins"]),
        "discovery_ms": median_ms([sys.executable, "-c", "import trainer_plugins; trainer_plugins.get_catalog()"]),
        "list_command_ms": median_ms([cli, "list"]),
        # doctor and explain with no backend runtime to import (the XLA plugin blocked): the target is
        # under 2 s; explain needs Lightning itself, so `import lightning` is its floor
        "doctor_without_backend_ms": median_ms([cli, "doctor"], runs=5, TRAINER_PLUGINS_BLOCK="xla"),
        "explain_cpu_command_ms": median_ms([cli, "explain", "--accelerator", "cpu"], runs=5),
        "import_lightning_ms": median_ms([sys.executable, "-c", "import lightning"], runs=5),
        **construction_ms(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()

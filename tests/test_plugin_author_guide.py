"""Every code block of docs/plugin-author.md, run: the examples are built, installed and used for real.

A block whose introducing paragraph names one file path (`my-strategy/pyproject.toml`) is written to
that path; each distribution then gets the empty ``__init__.py`` the guide mentions. The ``bash``
block is run with ``python=`` pointing at this test environment's interpreter (which has no pip,
the case the guide explains), and also for the second distribution; Python snippets run in a fresh
interpreter of this environment; the conformance-kit class runs under pytest, for both plugins.
The installed distributions are removed again at the end.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugin-author.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.DOTALL | re.MULTILINE)
PATH = re.compile(r"`(my-[\w-]+/[\w./-]+\.(?:toml|py))`")
DISTRIBUTIONS = ("my-strategy", "my-npu")
UV = shutil.which("uv", path=os.path.dirname(sys.executable)) or shutil.which("uv")

# It builds and installs two distributions: run once, by `tox -e docs`, not in every environment.
pytestmark = [
    pytest.mark.skipif(os.environ.get("TRAINER_PLUGINS_GUIDE_TESTS") != "1", reason="run by tox -e docs"),
    pytest.mark.skipif(UV is None, reason="needs uv (a test dependency)"),
]


def blocks() -> list[tuple[str, str | None, str]]:
    """``(language, file path or None, code)`` of each fenced block, in order."""
    text = GUIDE.read_text()
    found = []
    for match in FENCE.finditer(text):
        paragraph = text[: match.start()].rstrip("\n").split("\n\n")[-1]  # the text introducing the block
        paths = PATH.findall(paragraph)
        found.append((match.group(1), paths[0] if len(paths) == 1 else None, match.group(2)))
    return found


def run(command: list[str], cwd: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def uninstall(cwd: Path) -> None:
    subprocess.run([UV, "pip", "uninstall", "--python", sys.executable, *DISTRIBUTIONS], cwd=cwd, capture_output=True)


def test_the_guide_has_the_blocks_this_test_runs():
    kinds = [(language, path is not None) for language, path, _ in blocks()]
    files = [path for _, path, _ in blocks() if path]
    assert files == [
        "my-strategy/pyproject.toml",
        "my-strategy/my_strategy/hooks.py",
        "my-strategy/my_strategy/strategy.py",
        "my-npu/pyproject.toml",
        "my-npu/my_npu/hooks.py",
        "my-npu/my_npu/accelerator.py",
        "my-npu/my_npu/strategy.py",
    ]
    assert kinds.count(("bash", False)) == 1 and kinds.count(("python", False)) == 3
    assert "TRAINER_PLUGINS_API" in GUIDE.read_text().split("```")[0]  # explained before the first example


def test_every_block_of_the_guide_runs(tmp_path):
    snippets, commands = [], []
    for language, path, code in blocks():
        if path is not None:
            target = tmp_path / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(code)
        elif language == "bash":
            commands.append(code)
        else:
            snippets.append(code)
    for distribution in DISTRIBUTIONS:  # "with an empty __init__.py"
        (tmp_path / distribution / distribution.replace("-", "_") / "__init__.py").touch()

    (install,) = commands
    assert install.startswith("python=") and "./my-strategy" in install
    environment = re.sub(r"^python=\S+", f"python={sys.executable}", install)
    # the guide installs with uv from the PATH; use this environment's (the tools' uv works the same)
    env = {**os.environ, "PATH": f"{os.path.dirname(UV)}{os.pathsep}{os.environ['PATH']}"}
    uninstall(tmp_path)
    try:
        listed = run(["bash", "-euo", "pipefail", "-c", environment], tmp_path, env=env).stdout
        assert re.search(r"my_strategy  \[my-strategy 0\.1\.0\]  loaded\n    strategy: counting", listed), listed
        run(["bash", "-euo", "pipefail", "-c", environment.replace("./my-strategy", "./my-npu")], tmp_path, env=env)

        conformance = [code for code in snippets if "PluginConformance" in code]
        runs = [code for code in snippets if "PluginConformance" not in code]
        for code in runs:
            run([sys.executable, "-c", code], tmp_path)
        (kit,) = conformance
        (tmp_path / "test_my_strategy.py").write_text(kit)
        (tmp_path / "test_my_npu.py").write_text(
            kit.replace('"my_strategy"', '"my_npu"').replace("MyStrategy", "MyNPU")
        )
        result = run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_strategy.py", "test_my_npu.py"],
            tmp_path,
        )
        assert re.search(r"\d+ passed", result.stdout) and "failed" not in result.stdout
    finally:
        uninstall(tmp_path)

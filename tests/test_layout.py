"""The layout that shows the architecture (docs/design.md, "Where things live"), held against the sources.

Read from the files, nothing imported: the core names no backend plugin; each backend plugin keeps
the same map (``roles/``, ``runtime/``, ``strategies/`` and its own concerns beside them), every folder
saying in its ``__init__`` docstring what it holds; ``runtime/`` is the ground floor of a plugin, importing
no other folder of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core"
PLUGINS = {
    "xla_plugins": ROOT / "plugins" / "xla" / "xla_plugins",
    "torchtpu_plugins": ROOT / "plugins" / "torchtpu" / "torchtpu_plugins",
}
#: Names of the backend plugins (packages, distributions, variable prefixes) the core must not hold.
BACKEND_NAMES = (
    "xla_plugins",
    "xla-plugins",
    "XLA_PLUGINS",
    "torchtpu_plugins",
    "torchtpu-plugins",
    "TORCHTPU_PLUGINS",
)


def imported_modules(path: Path) -> set[str]:
    """The absolute module names ``path`` imports (at any depth: imports inside functions count)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_core_names_no_backend_plugin():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {name}"
        for path in sorted(CORE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for name in BACKEND_NAMES
        if name in line
    ]
    assert found == []


@pytest.mark.parametrize("package", sorted(PLUGINS))
def test_each_backend_plugin_keeps_the_same_map(package):
    folder = PLUGINS[package]
    assert (folder / "roles" / "accelerator.py").is_file() and (folder / "roles" / "precision.py").is_file()
    assert (folder / "runtime").is_dir() and (folder / "strategies").is_dir()
    assert (folder / "_hooks.py").is_file()  # the entry point's module, at the root
    for sub in (p for p in folder.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        init = sub / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), f"{sub} says what it holds"


@pytest.mark.parametrize("package", sorted(PLUGINS))
def test_runtime_is_the_ground_floor_of_each_plugin(package):
    folder = PLUGINS[package]
    others = {p.name for p in folder.iterdir() if p.is_dir() and p.name not in ("runtime", "__pycache__")}
    upward = {
        f"{path.relative_to(folder)} imports {name}"
        for path in (folder / "runtime").rglob("*.py")
        for name in imported_modules(path)
        if name.split(".")[0] == package and len(name.split(".")) > 1 and name.split(".")[1] in others
    }
    assert upward == set()

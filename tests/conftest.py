"""Shared test helpers. Tests run against the *installed* trainer-plugins and xla-plugins wheels."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from typing import Optional

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")

#: Whether torch_xla is installed (absent in the core-only tox environment).
HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None
PRECISION_VARIABLES = ("XLA_USE_F16", "XLA_USE_BF16", "XLA_DOWNCAST_BF16")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "xla: needs torch_xla (deselected in the core-only environment)")
    if HAS_TORCH_XLA:
        # torch sizes its autograd engine on a process's first backward pass: the XLA runtime must be
        # up by then for later XLA tests (test_xla_strategies checks the error otherwise).
        import torch
        import torch_xla

        torch.zeros(1, device=torch_xla.device())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_TORCH_XLA:
        return
    skip = pytest.mark.skip(reason="torch_xla is not installed")
    for item in items:
        if item.get_closest_marker("xla") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_precision_variable_leaks():
    """Every test leaves the precision variables as it found them: none set, none removed (issues 9 and 10)."""
    before = {name: os.environ.get(name) for name in PRECISION_VARIABLES}
    yield
    after = {name: os.environ.get(name) for name in PRECISION_VARIABLES}
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    assert after == before, f"test changed the precision variables: {before} -> {after}"


def run_python(
    code: str, env: Optional[Mapping[str, Optional[str]]] = None, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter of this environment; ``env`` updates os.environ (None values unset)."""
    environ = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"subprocess failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture
def extra_plugins():
    """Register in-memory plugins in the process-wide manager for one test: ``extra_plugins(name, plugin)``."""
    import trainer_plugins
    from trainer_plugins import PluginRecord
    from trainer_plugins._catalog import reset_catalogs

    added: list[str] = []

    def register(name: str, plugin: object, distribution: str = "test-dist", version: str = "1.0") -> None:
        trainer_plugins.get_plugin_manager().register_plugin(
            plugin, PluginRecord(name, f"tests.{name}", distribution, version)
        )
        added.append(name)
        reset_catalogs()

    yield register
    manager = trainer_plugins.get_plugin_manager()
    for name in added:
        if manager.get_plugin(name) is not None:
            manager.unregister(name=name)
        manager.records.pop(name, None)
    reset_catalogs()

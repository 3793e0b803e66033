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


def _has_torchtpu_standin() -> bool:
    """Whether torchtpu-plugins is installed with a torch it supports (>= 2.11), read without importing torch."""
    if importlib.util.find_spec("torchtpu_plugins") is None:
        return False
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        return Version(version("torch")).release >= (2, 11)
    except PackageNotFoundError:
        return False


#: Whether the TorchTPU stand-in device can run here (the torchtpu-torch* tox cells).
HAS_TORCHTPU_STANDIN = _has_torchtpu_standin()
# Elsewhere (torch 2.9 with torch_xla, or no torchtpu-plugins) the stand-in's test modules are not collected.
collect_ignore_glob = [] if HAS_TORCHTPU_STANDIN else ["test_torchtpu_*.py"]
PRECISION_VARIABLES = ("XLA_USE_F16", "XLA_USE_BF16", "XLA_DOWNCAST_BF16")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "xla: needs torch_xla (deselected in the core-only environment)")
    distributing = getattr(config.option, "dist", "no") != "no" and "PYTEST_XDIST_WORKER" not in os.environ
    if HAS_TORCH_XLA and not distributing:  # pytest-xdist's controller runs no test: it needs no runtime
        # torch sizes its autograd engine on a process's first backward pass: the XLA runtime must be
        # up by then for later XLA tests (test_xla_strategies checks the error otherwise).
        import torch
        import torch_xla

        torch.zeros(1, device=torch_xla.device())


#: What Lightning and the plugins write under the default ``default_root_dir``, the working directory.
RUN_OUTPUTS = ("lightning_logs", "checkpoints", "goodput")
CLONE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_outputs_before = pytest.StashKey[set]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_outputs_before] = {name for name in RUN_OUTPUTS if os.path.exists(os.path.join(CLONE, name))}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a test wrote run outputs into the clone (tests run in directories of their own)."""
    left = {name for name in RUN_OUTPUTS if os.path.exists(os.path.join(CLONE, name))}
    left -= session.config.stash.get(_outputs_before, set())
    if left and "PYTEST_XDIST_WORKER" not in os.environ:
        session.config.get_terminal_writer().line()
        session.config.get_terminal_writer().line(f"tests left {sorted(left)} in the clone {CLONE}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_xla = pytest.mark.skip(reason="torch_xla is not installed")
    skip_torchtpu = pytest.mark.skip(reason="torchtpu-plugins with torch >= 2.11 is not installed")
    for item in items:
        if not HAS_TORCH_XLA and item.get_closest_marker("xla") is not None:
            item.add_marker(skip_xla)
        if not HAS_TORCHTPU_STANDIN and item.get_closest_marker("torchtpu") is not None:
            item.add_marker(skip_torchtpu)


@pytest.fixture(scope="session", autouse=True)
def _session_working_directory(tmp_path_factory):
    """The working directory of module- and session-scoped fixtures: an empty one, never the clone."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("session-cwd"))
        yield


@pytest.fixture(autouse=True)
def _own_working_directory(_session_working_directory, tmp_path_factory, monkeypatch):
    """Every test runs in an empty working directory of its own.

    What Lightning writes under its default ``default_root_dir`` (the working directory:
    ``lightning_logs/``, ``checkpoints/``, ``goodput/``) then never lands in the clone, and tests that run
    at the same time (pytest-xdist workers, tox.ini) never read each other's files.
    """
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


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

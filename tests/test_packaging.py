"""Discovery through the installed distributions, and what happens at interpreter start-up."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib.metadata import distribution, files
from pathlib import Path

import pytest
from conftest import run_python
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def test_xla_plugins_advertises_its_hook_module_in_the_trainer_plugins_group():
    dist = distribution("xla-plugins")
    entry_points = [(ep.name, ep.value) for ep in dist.entry_points if ep.group == "trainer_plugins"]
    assert entry_points == [("xla", "xla_plugins._hooks")]


def test_xla_plugins_depends_on_the_core_lightning_torch_and_torch_xla():
    requires = {canonicalize_name(Requirement(line).name) for line in distribution("xla-plugins").requires or []}
    assert requires == {"trainer-plugins", "lightning", "torch", "torch-xla"}


def test_core_wheel_installs_the_startup_pth_file_and_its_module():
    installed = {str(path) for path in files("trainer-plugins") or []}
    assert {"trainer_plugins.pth", "_trainer_plugins_autoload.py"} <= installed


def test_discovery_finds_the_xla_distribution_without_importing_torch_lightning_or_torch_xla():
    result = run_python(
        """
        import json, sys
        import trainer_plugins
        record = trainer_plugins.get_plugin_manager().records["xla"]
        catalog = trainer_plugins.get_catalog()
        print(json.dumps({
            "record": [record.distribution, record.version, record.state, record.value],
            "accelerators": catalog.names("accelerator", "trainer"),
            "imported": sorted(m for m in ("torch", "torch_xla", "lightning") if m in sys.modules),
        }))
        """
    )
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["record"] == ["xla-plugins", distribution("xla-plugins").version, "loaded", "xla_plugins._hooks"]
    assert {"xla", "tpu", "cpu"} <= set(found["accelerators"])
    assert found["imported"] == []


STARTUP_PROBE = """
import json, sys
print(json.dumps({
    "hook_armed": any(type(f).__name__ == "LightningImportHook" for f in sys.meta_path),
    "imported": sorted(m for m in ("torch", "lightning", "torch_xla", "pluggy", "trainer_plugins") if m in sys.modules),
}))
"""


def test_interpreter_start_arms_the_import_hook_and_imports_nothing_heavy():
    found = json.loads(run_python(STARTUP_PROBE, env={"TRAINER_PLUGINS_AUTOLOAD": None}).stdout)
    assert found == {"hook_armed": True, "imported": []}


def test_autoload_off_switch_leaves_the_interpreter_untouched():
    found = json.loads(run_python(STARTUP_PROBE, env={"TRAINER_PLUGINS_AUTOLOAD": "0"}).stdout)
    assert found == {"hook_armed": False, "imported": []}


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_an_unreadable_autoload_value_is_reported_once_when_lightning_is_imported_and_leaves_autoload_off():
    notice = (
        "trainer-plugins: TRAINER_PLUGINS_AUTOLOAD='maybe' is not understood; use 1/true/yes/on or 0/false/no/off;"
        " automatic registration stays off"
    )
    result = run_python(STARTUP_PROBE, env={"TRAINER_PLUGINS_AUTOLOAD": "maybe"})
    assert json.loads(result.stdout)["hook_armed"] is False
    assert notice not in result.stderr  # a process that does not import Lightning is not told
    probe = (
        "import lightning, pytorch_lightning" if importlib.util.find_spec("pytorch_lightning") else "import lightning"
    )
    result = run_python(f"{probe}\n{STARTUP_PROBE}", env={"TRAINER_PLUGINS_AUTOLOAD": "maybe"})
    assert json.loads(result.stdout)["hook_armed"] is False
    assert result.stderr.splitlines().count(notice) == 1  # once, even when site-packages is read twice (lib64)


def test_the_installed_versions_are_within_the_declared_ranges():
    from trainer_plugins import unsupported_versions

    assert unsupported_versions("trainer-plugins") == []
    assert unsupported_versions("xla-plugins", ["lightning"]) == []


def declared_requirements(extra: str = "") -> dict[str, list[Requirement]]:
    """xla-plugins' requirements that apply with ``extra`` (or none), by canonical name."""
    found: dict[str, list[Requirement]] = {}
    for line in distribution("xla-plugins").requires or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
            found.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    return found


# The releases on the package index around the supported ones (torch has no 2.8.1; torch_xla 2.9.0 is its last).
RELEASES = {
    "torch": ["2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0"],
    "torch-xla": ["2.7.0", "2.8.0", "2.8.1", "2.9.0"],
}


def allowed(requirements: list[Requirement]) -> list[str]:
    (name,) = {canonicalize_name(r.name) for r in requirements}
    return [v for v in RELEASES[name] if all(v in r.specifier for r in requirements)]


def test_each_supported_torch_xla_pair_is_installable_and_no_extra_allows_a_mismatch():
    """The extras xla29/xla28 pin one pair each; the base admits both pairs and resolves the newest one.

    torch_xla does not declare the torch it is built against; a resolver picks the newest release of
    each requirement in a fresh environment, so the base range's newest torch and torch_xla must pair
    (torch 2.9.1 must not be admitted: torch_xla 2.9 is built against 2.9.0).
    """
    from packaging.version import Version

    from xla_plugins.runtime._probes import version_mismatch

    base = declared_requirements()
    assert allowed(base["torch"]) == ["2.8.0", "2.9.0"]
    assert allowed(base["torch-xla"]) == ["2.8.0", "2.8.1", "2.9.0"]
    assert version_mismatch(Version(allowed(base["torch-xla"])[-1]), Version(allowed(base["torch"])[-1])) is None
    for extra, torch in [("xla29", "2.9.0"), ("xla28", "2.8.0")]:
        pinned = declared_requirements(extra)
        assert allowed(pinned["torch"]) == [torch]
        torch_xlas = allowed(pinned["torch-xla"])
        assert torch_xlas and all(v.startswith(torch[:4]) for v in torch_xlas)
        assert all(version_mismatch(Version(x), Version(torch)) is None for x in torch_xlas)
    assert {tuple(sorted(r.extras)) for r in declared_requirements("tpu")["torch-xla"]} == {(), ("tpu",)}


@pytest.mark.slow  # asks the package index (metadata only): primary tox cell only (tox.ini)
@pytest.mark.parametrize("extra, torch", [("", "2.9.0"), ("xla29", "2.9.0"), ("xla28", "2.8.0")])
def test_a_resolver_installs_each_supported_pair_from_the_metadata(extra, torch, tmp_path):
    """uv resolves the checkout's two distributions (with ``extra``) to a matching torch / torch_xla pair."""
    root = Path(__file__).resolve().parents[1]
    wanted = f"xla-plugins[{extra}]" if extra else "xla-plugins"
    requirements = tmp_path / "requirements.in"
    requirements.write_text(f"trainer-plugins @ {root.as_uri()}\n{wanted} @ {(root / 'plugins' / 'xla').as_uri()}\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "uv",
            "pip",
            "compile",
            "--quiet",
            "--no-header",
            "--python-version",
            "3.11",
            str(requirements),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    pins = dict(line.split("==") for line in result.stdout.splitlines() if "==" in line and not line.startswith(" "))
    assert pins["torch"] == torch and pins["torch-xla"].startswith(torch[:4])


def test_versions_outside_a_declared_range_are_named_with_the_range(monkeypatch):
    import trainer_plugins._versions as versions

    monkeypatch.setattr(versions, "version", lambda name: "2.7.1" if name == "lightning" else "1.0")
    assert versions.unsupported_versions("trainer-plugins", ["lightning"]) == [
        "trainer-plugins supports lightning<2.7,>=2.5, but lightning 2.7.1 is installed"
    ]


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_a_reloaded_start_up_module_does_not_arm_a_second_hook():
    result = run_python(
        """
        import importlib, sys
        import _trainer_plugins_autoload as autoload
        autoload = importlib.reload(autoload)
        autoload.arm()
        import lightning
        import trainer_plugins
        print(sum(type(f).__name__ == "LightningImportHook" for f in sys.meta_path), trainer_plugins.installed())
        """,
        env={"TRAINER_PLUGINS_AUTOLOAD": None},
    )
    assert result.stdout.split()[-2:] == ["1", "True"]


#: Top-level modules of the distributions in this repository (and the start-up module of the core).
OUR_MODULES = ("trainer_plugins", "_trainer_plugins_autoload", "xla_plugins", "localsgd_plugin")


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_autoload_off_a_fit_imports_runs_and_prints_nothing_of_ours(tmp_path):
    """TRAINER_PLUGINS_AUTOLOAD=0: no module of ours is imported, no line of ours written, no checkpoint record."""
    result = run_python(
        f"""
        import sys
        import torch
        import lightning as L
        from lightning.pytorch.demos.boring_classes import BoringModel

        trainer = L.Trainer(accelerator="cpu", max_steps=2, default_root_dir={str(tmp_path)!r}, logger=False,
                            enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(BoringModel())
        (path,) = trainer.checkpoint_callback.best_model_path,
        print("checkpoint keys:", sorted(torch.load(path, weights_only=False)))
        print("callbacks:", sorted(type(callback).__name__ for callback in trainer.callbacks))
        print("ours:", sorted(name for name in sys.modules if name.split(".")[0] in {OUR_MODULES!r}))
        """,
        env={"TRAINER_PLUGINS_AUTOLOAD": "0"},
    )
    lines = result.stdout.splitlines()
    assert "ours: []" in lines
    assert "callbacks: ['ModelCheckpoint']" in lines
    assert not any("trainer_plugins" in line for line in lines if line.startswith("checkpoint keys:"))
    output = (result.stdout + result.stderr).lower()
    assert "trainer-plugins" not in output and "trainer_plugins" not in output and "pluginset" not in output

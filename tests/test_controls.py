"""Controls from environment variables and from code (docs/controls.md)."""

from __future__ import annotations

import os

import pytest

import trainer_plugins
from trainer_plugins import Controls


def test_controls_are_read_from_the_environment():
    controls = Controls.from_env(
        {
            "TRAINER_PLUGINS_AUTOLOAD": "off",
            "TRAINER_PLUGINS_BLOCK": "npu, broken-dist",
            "TRAINER_PLUGINS_ALLOW": "xla,npu",
            "TRAINER_PLUGINS_PIN_ACCELERATOR": "cpu",
            "TRAINER_PLUGINS_PIN_STRATEGY": " ddp ",
        }
    )
    assert controls == Controls(
        autoload=False,
        block=frozenset({"npu", "broken-dist"}),
        allow=frozenset({"xla", "npu"}),
        pins={"accelerator": "cpu", "strategy": "ddp"},
    )


def test_defaults_load_everything_and_pin_nothing():
    assert Controls.from_env({}) == Controls(autoload=True, block=frozenset(), allow=None, pins={})


@pytest.mark.parametrize("value", ["maybe", "2", "nein"])
def test_an_unreadable_autoload_value_is_rejected_naming_it(value):
    with pytest.raises(ValueError, match=f"TRAINER_PLUGINS_AUTOLOAD={value!r} is not understood"):
        Controls.from_env({"TRAINER_PLUGINS_AUTOLOAD": value})


def test_block_matches_the_plugin_or_the_distribution_name():
    controls = Controls(block=frozenset({"broken-dist"}))
    assert controls.admits("npu", "broken-dist") == "blocked by TRAINER_PLUGINS_BLOCK (broken-dist)"
    assert controls.admits("xla", "xla-plugins") is None


def test_allow_admits_only_the_listed_plugins():
    controls = Controls(allow=frozenset({"xla"}))
    assert controls.admits("xla", "xla-plugins") is None
    assert controls.admits("npu", "npu-dist") == "not in TRAINER_PLUGINS_ALLOW (xla)"
    assert Controls(allow=frozenset()).admits("xla", None) == "not in TRAINER_PLUGINS_ALLOW (empty)"


CONTROL_VARIABLES = (
    "TRAINER_PLUGINS_AUTOLOAD",
    "TRAINER_PLUGINS_BLOCK",
    "TRAINER_PLUGINS_ALLOW",
    "TRAINER_PLUGINS_PIN_ACCELERATOR",
    "TRAINER_PLUGINS_PIN_STRATEGY",
    "TRAINER_PLUGINS_PIN_ENVIRONMENT",
)


@pytest.fixture
def clean_controls():
    """Start without control variables; afterwards restore them exactly and rebuild the plugin set."""
    saved = {name: os.environ.pop(name, None) for name in CONTROL_VARIABLES}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    trainer_plugins.reset_plugin_manager()


def test_configure_from_code_writes_the_same_variables_so_workers_inherit_them(clean_controls):
    controls = trainer_plugins.configure(
        autoload=False, block=["npu"], allow=["xla", "npu"], pins={"accelerator": "cpu"}
    )
    assert controls == Controls(
        autoload=False, block=frozenset({"npu"}), allow=frozenset({"xla", "npu"}), pins={"accelerator": "cpu"}
    )
    assert os.environ["TRAINER_PLUGINS_AUTOLOAD"] == "0"
    assert os.environ["TRAINER_PLUGINS_BLOCK"] == "npu"
    assert os.environ["TRAINER_PLUGINS_PIN_ACCELERATOR"] == "cpu"
    assert trainer_plugins.configure(pins={"accelerator": None}).pins == {}
    assert "TRAINER_PLUGINS_PIN_ACCELERATOR" not in os.environ


def test_configure_rebuilds_the_plugin_set(clean_controls):
    before = trainer_plugins.get_plugin_manager()
    trainer_plugins.configure(block=["xla"])
    after = trainer_plugins.get_plugin_manager()
    assert after is not before
    assert after.records["xla"].state == "blocked"


def test_configure_rejects_an_unknown_role(clean_controls):
    with pytest.raises(
        ValueError, match="cannot pin role 'optimizer'; pinnable roles are accelerator, strategy, environment"
    ):
        trainer_plugins.configure(pins={"optimizer": "adam"})


def _report_plugin_states(queue) -> None:
    """Runs in a freshly spawned interpreter: what its own plugin manager made of each plugin."""
    import trainer_plugins as fresh

    queue.put({name: record.state for name, record in fresh.get_plugin_manager().records.items()})


def test_controls_set_from_code_hold_in_spawned_worker_processes(clean_controls):
    import multiprocessing

    trainer_plugins.configure(block=["xla"], pins={"accelerator": "cpu"})
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    worker = context.Process(target=_report_plugin_states, args=(queue,))
    worker.start()
    states = queue.get(timeout=120)
    worker.join(30)
    assert states["xla"] == "blocked" and states["lightning"] == "loaded"


def test_a_string_is_read_like_the_environment_variable_and_star_allows_all_again(clean_controls):
    assert trainer_plugins.configure(block="xla, npu").block == frozenset({"xla", "npu"})
    assert trainer_plugins.configure(allow=["xla"]).allow == frozenset({"xla"})
    assert trainer_plugins.configure(allow="*").allow is None


def test_names_compare_as_pep_503_does():
    controls = Controls.from_env({"TRAINER_PLUGINS_BLOCK": "XLA_Plugins", "TRAINER_PLUGINS_PIN_ACCELERATOR": "CPU"})
    assert controls.admits("xla", "xla-plugins") == "blocked by TRAINER_PLUGINS_BLOCK (xla-plugins)"
    assert controls.pins == {"accelerator": "cpu"}


def test_an_unreadable_control_is_one_line_and_exit_status_2_from_the_cli():
    from conftest import run_python

    result = run_python(
        "import sys; from trainer_plugins._cli import main; sys.exit(main(['list']))",
        env={"TRAINER_PLUGINS_AUTOLOAD": "maybe"},
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if "TRAINER_PLUGINS_AUTOLOAD" in line] == [
        "trainer-plugins: error: TRAINER_PLUGINS_AUTOLOAD='maybe' is not understood; use 1/true/yes/on or"
        " 0/false/no/off"
    ]


def test_install_with_an_unreadable_control_raises_once_and_trainers_still_run(monkeypatch):
    L = pytest.importorskip("lightning")
    from trainer_plugins._controls import ControlError

    monkeypatch.setenv("TRAINER_PLUGINS_AUTOLOAD", "maybe")
    trainer_plugins.reset_plugin_manager()
    with pytest.raises(ControlError, match="TRAINER_PLUGINS_AUTOLOAD='maybe' is not understood"):
        trainer_plugins.install()
    assert type(L.Trainer(accelerator="cpu", logger=False).strategy).__name__ == "SingleDeviceStrategy"
    trainer_plugins.reset_plugin_manager()


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan"])
def test_an_unreadable_probe_timeout_names_the_variable(value):
    from trainer_plugins._controls import ControlError

    with pytest.raises(ControlError, match=f"TRAINER_PLUGINS_PROBE_TIMEOUT='{value}' is not understood"):
        Controls.from_env({"TRAINER_PLUGINS_PROBE_TIMEOUT": value})


@pytest.mark.parametrize("pinned", ["slurm", "lsf", "xla"])
def test_a_pinned_environment_that_does_not_apply_to_the_run_is_reported_as_such(pinned, monkeypatch):
    pytest.importorskip("lightning")
    monkeypatch.setenv("TRAINER_PLUGINS_PIN_ENVIRONMENT", pinned)
    with pytest.raises(ValueError, match=f"TRAINER_PLUGINS_PIN_ENVIRONMENT='{pinned}' does not apply to this run: "):
        trainer_plugins.explain(accelerator="cpu", devices=2, strategy="ddp")

"""The `trainer-plugins` console command: list, doctor, explain."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import version

import pytest
from conftest import HAS_TORCH_XLA, run_python

from trainer_plugins._is_distributed import WHITELISTED


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = shutil.which("trainer-plugins", path=os.path.dirname(sys.executable))
    assert command, "the console script is installed next to the interpreter"
    return subprocess.run(
        [command, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


def test_list_shows_each_plugin_its_distribution_state_and_names():
    result = cli("list")
    assert result.returncode == 0
    assert f"xla  [xla-plugins {version('xla-plugins')}]  loaded" in result.stdout
    assert "    strategy: single_xla, single_tpu (deprecated), xla, xla_debug, xla_spmd, xla_fsdp_v2" in result.stdout
    assert "accelerator 'tpu' is claimed by lightning" in result.stdout  # the XLA plugin's override, reported


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_explain_gives_the_decisions_as_json():
    result = cli("--json", "explain", "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp")
    assert result.returncode == 0, result.stderr
    rows = {row["role"]: row for row in json.loads(result.stdout)}
    assert rows["strategy"]["choice"] == "ddp (lightning.pytorch.strategies.ddp.DDPStrategy)"
    assert rows["is_distributed"] == {
        "role": "is_distributed",
        "choice": "True",
        "plugin": "trainer-plugins",
        "reason": WHITELISTED,
    }


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_explain_reports_rejected_flags_with_exit_status_1():
    result = cli("explain", "--accelerator", "cpu", "--strategy", "warp_drive")
    assert result.returncode == 1
    assert "error: ValueError: You selected an invalid strategy name: `strategy='warp_drive'`" in result.stderr


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
@pytest.mark.skipif(not HAS_TORCH_XLA, reason="describes the XLA runtime")
def test_doctor_describes_the_xla_runtime():
    result = cli("--json", "doctor", env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"})
    assert result.returncode == 0, result.stderr
    backends = json.loads(result.stdout)["backends"]
    xla = backends[f"xla (xla-plugins {version('xla-plugins')})"]
    assert xla == {
        "torch": version("torch"),
        "torch_xla": version("torch_xla"),
        "PJRT_DEVICE": "CPU",
        "accelerator='auto'": "does not pick XLA (PJRT_DEVICE=CPU: accelerator='auto' never picks torch_xla's CPU"
        " device (by policy: plain Lightning runs such a script on its own CPU accelerator); pass"
        " accelerator='tpu' (or 'xla') to run on it)",
        "runtime": "PJRT",
        "device type": "CPU",
        "device count": 4,
        "host index": 0,  # one host: no warnings (tests/test_pod_slices.py has a simulated slice)
        "host count": 1,
        "local device count": 4,
        "global device count": 4,
    }
    assert backends[f"lightning (lightning {version('lightning')})"]["lightning"] == version("lightning")


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """``trainer-plugins ARGS`` in this process: (exit status, stdout, stderr)."""
    from trainer_plugins._cli import main

    try:
        status = main(list(args))
    except SystemExit as exit:  # argparse: --help, usage errors
        status = int(exit.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


EXPLAINED_ROLES = ["accelerator", "devices", "environment", "strategy", "precision", "is_distributed"]
LIGHTNING = f"lightning (lightning {version('lightning')})"
XLA = f"xla (xla-plugins {version('xla-plugins')})"


def check_json(command: str, document, blocked: tuple[str, ...] = ()) -> None:
    """What ``trainer-plugins --json <command>`` prints for this repository's plugins (``blocked`` ones blocked)."""
    if command == "list":
        states = {plugin["name"]: plugin["state"] for plugin in document["plugins"]}
        expected = {"lightning": "loaded", "xla": "loaded", "localsgd": "loaded"}
        assert states == {**expected, **dict.fromkeys(blocked, "blocked")}
        localsgd = next(plugin for plugin in document["plugins"] if plugin["name"] == "localsgd")
        assert [entry["name"] for entry in localsgd["provides"]["strategy"]] == ["local_sgd", "local_sgd_8"]
        tpu = [conflict for conflict in document["conflicts"] if conflict.startswith("accelerator 'tpu'")]
        assert tpu == ([] if "xla" in blocked else [f"accelerator 'tpu' is claimed by {LIGHTNING}, {XLA}; {XLA} wins"])
    elif command == "doctor":
        assert set(document) == {"backends", "availability", "conflicts", "quarantined", "side effects"}
        # which plugin serves Lightning's accelerator name "tpu"
        assert document["conflicts"] == ({} if "xla" in blocked else {"accelerator 'tpu'": f"{XLA} serves it"})
        assert document["backends"][LIGHTNING]["lightning"] == version("lightning")
        if "xla" in blocked:
            assert XLA not in document["backends"]
        else:
            installed = version("torch_xla") if HAS_TORCH_XLA else "not installed"
            assert document["backends"][XLA]["torch_xla"] == installed
        assert set(document["availability"]) == (set() if "xla" in blocked else {"xla"})
        assert (document["quarantined"], document["side effects"]) == ({}, {})
    else:
        assert [row["role"] for row in document] == EXPLAINED_ROLES
        choices = {row["role"]: row["choice"] for row in document}
        assert choices["accelerator"] == "cpu (lightning.pytorch.accelerators.cpu.CPUAccelerator)"
        assert choices["strategy"] == "single_device (lightning.pytorch.strategies.single_device.SingleDeviceStrategy)"
        assert choices["is_distributed"] == "False"


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
@pytest.mark.parametrize("command", [["list"], ["doctor"], ["explain", "--accelerator", "cpu", "--devices", "1"]])
def test_json_is_accepted_before_and_after_every_subcommand(capsys, command, before):
    args = ["--json", *command] if before else [*command, "--json"]
    status, out, err = run_main(capsys, *args)
    assert status == 0, err
    check_json(command[0], json.loads(out))  # stdout is JSON only, whatever the order


def test_json_given_twice_or_not_at_all(capsys):
    assert json.loads(run_main(capsys, "--json", "list", "--json")[1])["plugins"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(run_main(capsys, "list")[1])


@pytest.mark.parametrize("command", ["list", "doctor", "explain"])
def test_every_option_has_help_text(capsys, command):
    from trainer_plugins._cli import _parser

    parser = _parser()
    subparser = next(action for action in parser._subparsers._group_actions).choices[command]
    for action in [*parser._actions, *subparser._actions]:
        assert action.help, f"{command}: {action.option_strings or action.dest} has no help text"
    status, out, _ = run_main(capsys, command, "--help")
    assert status == 0 and "--json" in out


def test_list_ends_with_a_legend_of_every_state_and_mark_word():
    from trainer_plugins._cli import MARK_LEGEND, STATE_LEGEND

    lines = cli("list").stdout.splitlines()
    start = lines.index("states:")
    legend = lines[start:]
    assert legend == [
        "states:",
        *(f"    {word}: {meaning}" for word, meaning in STATE_LEGEND.items()),
        "marks:",
        *(f"    ({word}): {meaning}" for word, meaning in MARK_LEGEND.items()),
    ]
    assert set(STATE_LEGEND) == {"loaded", "quarantined", "blocked"}
    for line in lines[:start]:  # every state and mark word shown above is explained
        if line and not line.startswith(" ") and line != "conflicts:":
            assert line.split("]  ")[1].split(" (")[0] in STATE_LEGEND, line
        for mark in ("(deprecated", "(not active", ", not active"):
            if mark in line:
                assert mark.strip("(, ") in MARK_LEGEND


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
@pytest.mark.parametrize("args", [["doctor"], ["explain", "--accelerator", "cpu", "--devices", "1"]])
def test_doctor_and_explain_report_their_time_and_import_no_backend_they_do_not_need(args):
    # Blocking the XLA plugin leaves only Lightning to answer: nothing may import torch_xla then
    # (its import and runtime start dominate the command's time; benchmarks/startup.py has the figures).
    code = f"""
        import sys
        from trainer_plugins._cli import main
        status = main({args!r})
        print("torch_xla imported:", "torch_xla" in sys.modules)
        sys.exit(status)
    """
    result = run_python(code, env={"TRAINER_PLUGINS_BLOCK": "xla"})
    *_, took, imported = result.stdout.splitlines()
    assert re.fullmatch(r"took \d+\.\d\d s", took), result.stdout
    assert imported == "torch_xla imported: False"
    json_result = cli("--json", *args, env={"TRAINER_PLUGINS_BLOCK": "xla"})
    check_json(args[0], json.loads(json_result.stdout), blocked=("xla",))
    assert re.fullmatch(r"took \d+\.\d\d s\n", json_result.stderr)  # stdout stays pure JSON


def test_usage_errors_exit_with_status_2():
    assert cli("frobnicate").returncode == 2


@pytest.mark.parametrize("args", [["list", "--json"], ["list"]])
def test_a_reader_that_closed_the_pipe_ends_the_command_without_a_traceback(args):
    """``trainer-plugins ... | head``: head exits after its lines; the command's next write meets a closed pipe.

    The pipe's reading end is closed before the command starts, so every write fails (deterministic,
    where a real ``head`` closes it at a moment that depends on the scheduler).
    """
    command = shutil.which("trainer-plugins", path=os.path.dirname(sys.executable))
    assert command
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([command, *args], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 141  # 128 + SIGPIPE, as a shell reports a command ended by a closed pipe

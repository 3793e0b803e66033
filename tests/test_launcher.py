"""The spawn launcher's failure handling on 4 PJRT CPU devices: dead workers, hung replicas, killed main process.

Each case runs in a fresh interpreter under a hard timeout (tests/scripts/launcher_faults.py, with
tests/xla_cpu_harness.py: the one worker process drives the 4 devices as threads).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla

SCRIPT = Path(__file__).parent / "scripts" / "launcher_faults.py"


def environment() -> dict[str, str]:
    from xla_cpu_harness import required_environment

    return {**os.environ, **required_environment(4)}


def state(pid: int) -> str | None:
    """The process's state letter from /proc (``None`` once it is gone; ``"Z"``: exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.fixture(scope="module")
def faults() -> dict:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "report"], env=environment(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_a_worker_ending_with_an_exit_code_is_reported_with_its_ranks_and_code(faults):
    report = faults["exits"]
    assert report["type"] == "WorkerDiedError"
    assert (report["ranks"], report["exitcode"]) == ([0, 1, 2, 3], 3)
    assert "running the replicas of ranks 0, 1, 2, 3 exited with code 3 without reporting" in report["message"]


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_a_worker_killed_by_a_signal_is_reported_with_its_ranks_and_the_signal(faults):
    report = faults["is_killed"]
    assert report["type"] == "WorkerDiedError"
    assert (report["ranks"], report["exitcode"]) == ([0, 1, 2, 3], -signal.SIGKILL)
    assert "running the replicas of ranks 0, 1, 2, 3 was killed by signal SIGKILL" in report["message"]


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_a_hung_replica_is_reported_with_its_rank_and_where_it_is_stuck(faults):
    report = faults["hangs"]
    assert (report["type"], report["rank"]) == ("ReplicaHangError", 1)
    # reported once 10 s passed without progress; the watch looks twice a second, so it may say 10 or 11 s
    seconds = re.match(r"The XLA replica of rank 1 made no progress for (\d+) s \(stuck at ", report["message"])
    assert seconds is not None, report["message"]
    assert int(seconds[1]) >= 10
    assert "launcher_faults.py:" in report["message"] and "in hangs)" in report["message"]
    assert "XLA_PLUGINS_REPLICA_TIMEOUT=10 s" in report["message"]
    # every replica's stack comes along: rank 1 in the test's function, the others in the rendezvous
    assert "Replica of rank 1 is at:" in report["cause"] and "in hangs" in report["cause"]
    assert report["cause"].count("in rendezvous") == 3


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_a_replica_that_keeps_making_progress_is_not_reported_however_long_it_runs(faults):
    # 12 s of barriers one second apart, under a 10 s timeout: the watch measures time since progress
    report = faults["slow_but_moving"]
    assert report["type"] is None, report


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_launch_returns_what_rank_0_returned_when_the_other_replica_threads_return_later(faults):
    # Lightning's launcher queues the result of every replica thread of a worker; rank 0 returns first here
    assert faults["returns_its_rank"] == {"type": None, "value": 0}


@pytest.mark.slow  # primary tox cell only (tox.ini)
@pytest.mark.parametrize("sent", [signal.SIGKILL, signal.SIGTERM])
def test_no_worker_outlives_a_killed_main_process(sent, tmp_path):
    main = subprocess.Popen(
        [sys.executable, str(SCRIPT), "orphan", str(tmp_path)],
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        pid_file = tmp_path / "worker.pid"
        deadline = time.monotonic() + 240
        while not pid_file.exists() and main.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # waiting for a condition, with a deadline: no race on timing
        assert pid_file.exists(), f"the replica never started (main exit code {main.poll()})"
        worker = int(pid_file.read_text())
        assert worker != main.pid and state(worker) not in (None, "Z")
    finally:
        main.send_signal(sent)
        main.wait(timeout=30)
    deadline = time.monotonic() + 10
    while state(worker) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state(worker) in (None, "Z"), f"worker {worker} still runs 10 s after its main process got {sent.name}"


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan"])
def test_an_unreadable_replica_timeout_is_an_error_naming_the_variable(value, monkeypatch):
    from xla_plugins.strategies.launchers import replica_timeout

    monkeypatch.setenv("XLA_PLUGINS_REPLICA_TIMEOUT", value)
    with pytest.raises(ValueError, match=f"XLA_PLUGINS_REPLICA_TIMEOUT='{value}' is not valid"):
        replica_timeout()


@pytest.mark.parametrize(("value", "seconds"), [("", 1800.0), ("2.5", 2.5), ("1800", 1800.0), ("0", None)])
def test_the_replica_timeout_default_value_and_off_switch(value, seconds, monkeypatch):
    from xla_plugins.strategies.launchers import replica_timeout

    monkeypatch.setenv("XLA_PLUGINS_REPLICA_TIMEOUT", value)
    assert replica_timeout() == seconds

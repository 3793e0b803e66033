"""Sharded ``xla_fsdp_v2`` checkpoints written in the background and committed atomically (4 PJRT CPU devices).

Each scenario runs tests/scripts/sharded_writes.py in its own interpreter (SPMD mode is process-wide).
Writes are held by events the script controls, never by sleeping; the SIGKILL case stops the
second write after its shards and before its metadata and commit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.xla, pytest.mark.slow]  # several devices: primary tox cell only (tox.ini)

SCRIPT = Path(__file__).parent / "scripts" / "sharded_writes.py"
ENVIRONMENT = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}


def run(out: Path, scenario: str) -> dict:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--scenario", scenario],
        env={**os.environ, **ENVIRONMENT},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    return run(tmp_path_factory.mktemp("background"), "background")


def test_the_trainer_steps_go_on_while_a_sharded_checkpoint_is_written_and_fit_returns_after_the_last(report):
    trainer = report["trainer"]
    assert trainer["io"] == "BackgroundXLACheckpointIO"  # the default of xla_fsdp_v2, sharded format too
    # saves after steps 3 and 6: steps 4 and 5 ran while the first was held, 7 and 8 while the second was
    assert [entry for entry in trainer["during"] if entry[0] != 6] == [
        [4, "epoch=0-step=3.ckpt"],
        [5, "epoch=0-step=3.ckpt"],
        [7, "epoch=0-step=6.ckpt"],
        [8, "epoch=0-step=6.ckpt"],
    ]
    assert trainer["events"] == [
        ["start", "epoch=0-step=3.ckpt"],
        ["end", "epoch=0-step=3.ckpt"],
        ["start", "epoch=0-step=6.ckpt"],
        ["end", "epoch=0-step=6.ckpt"],
    ]
    # fit returned after the last write was committed; no temporary directory is left
    assert trainer["left"] == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"]
    assert trainer["files_of_step6"] == [".metadata", "__0_0.distcp", "meta.pt"]
    assert trainer["global_step_of_step6"] == 6


@pytest.mark.parametrize("state_dict_type", ["sharded", "full"])
def test_fabric_save_returns_while_written_keeps_the_previous_checkpoint_and_load_waits(report, state_dict_type):
    fabric = report["fabric"][state_dict_type]
    assert fabric["default_io"] == "BackgroundXLACheckpointIO" and fabric["given_io_kept"] is True
    assert fabric["pending_after_save"] is True  # fabric.save returned with its write held
    assert fabric["step_while_held"] == 0  # the path still held the previous, complete checkpoint
    assert fabric["events"] == ["start", "end", "start", "load waits", "end", "loaded"]
    assert fabric["loaded_step"] == 1 and fabric["loaded_equal"] is True
    assert f"fabric-{state_dict_type}.ckpt" in fabric["left"]
    assert [entry for entry in fabric["left"] if entry.startswith(".")] == []  # no temporary left


def test_on_an_object_store_a_sharded_checkpoint_counts_only_once_its_commit_marker_is_written(report):
    memory = report["memory"]
    assert memory["listing"] == ["last.ckpt", "last.ckpt.commit"]
    assert memory["marker"] == str(memory["size"]) and memory["committed"] is True
    assert memory["uncommitted_is_committed"] is False
    assert memory["last"] == "memory:///sharded-writes/ckpts/last.ckpt"  # the newer last-v1.ckpt is skipped
    assert memory["resumed_at"] == 4
    assert memory["last_without_markers"] is None


def test_a_process_killed_in_the_middle_of_a_sharded_write_leaves_the_previous_for_ckpt_path_last(tmp_path):
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--scenario", "killed"],
        env={**os.environ, **ENVIRONMENT},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for line in process.stdout:
            if line.strip() == "MID-WRITE":
                break
        else:
            pytest.fail("the script ended before its second write")
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=120)
    assert process.returncode == -signal.SIGKILL
    directory = tmp_path / "checkpoints"
    names = sorted(os.listdir(directory))
    assert names[0].startswith(".last.ckpt.tmp-") and names[1:] == ["last.ckpt"], names
    assert "meta.pt" not in os.listdir(directory / names[0])  # killed in the middle: shards, no metadata yet
    assert sorted(os.listdir(directory / "last.ckpt")) == [".metadata", "__0_0.distcp", "meta.pt"]

    resumed = run(tmp_path, "resume")
    assert resumed["started_at"] == 2
    assert resumed["weights"] == json.loads((tmp_path / "weights-2.json").read_text())
    assert resumed["weights"] != json.loads((tmp_path / "weights-4.json").read_text())

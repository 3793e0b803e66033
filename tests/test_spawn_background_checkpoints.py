"""The spawn strategy's (``"xla"``) checkpoints are written in the background in its workers, Trainer and Fabric.

2 replicas, threads of one worker (tests/xla_cpu_harness.py), in tests/scripts/spawn_writes.py. Writes
are held by events the script controls, never by sleeping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.xla, pytest.mark.slow]  # several devices and processes: primary tox cell only (tox.ini)

SCRIPT = Path(__file__).parent / "scripts" / "spawn_writes.py"
DEVICES = 2


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    from xla_cpu_harness import required_environment  # imports torch_xla: only once the test runs

    out = tmp_path_factory.mktemp("spawn")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--devices", str(DEVICES)],
        env={**os.environ, **required_environment(DEVICES), "XLA_PLUGINS_REPLICA_TIMEOUT": "300"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return json.loads((out / "report.json").read_text())


def test_spawn_workers_train_on_while_a_checkpoint_is_written_and_fit_returns_after_the_last_write(report):
    trainer = report["trainer"]
    assert trainer["default_io"] == "BackgroundXLACheckpointIO"
    assert trainer["pid"] != trainer["main_pid"]  # written in the worker
    # ModelCheckpoint saved after steps 3 and 6 (rank 0 writes): 4 and 5 ran while the first write was held,
    # 7 and 8 while the second was (it is released when fit tears the checkpoint IO down)
    assert [entry for entry in trainer["during"] if entry[0] != 6] == [
        [4, "epoch=0-step=3.ckpt"],
        [5, "epoch=0-step=3.ckpt"],
        [7, "epoch=0-step=6.ckpt"],
        [8, "epoch=0-step=6.ckpt"],
    ]
    saves = [event for event in trainer["events"] if event[1].startswith("epoch=")]
    assert saves == [
        ["start", "epoch=0-step=3.ckpt"],
        ["end", "epoch=0-step=3.ckpt"],
        ["start", "epoch=0-step=6.ckpt"],
        ["end", "epoch=0-step=6.ckpt"],
        ["fit ends", "epoch=-"],  # the worker's fit ended after its last write did
    ]
    # when fit returned in the main process, both checkpoints were complete and nothing else was left
    assert trainer["left"] == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"]
    assert trainer["global_steps"] == {"epoch=0-step=3.ckpt": 3, "epoch=0-step=6.ckpt": 6}


def test_spawn_fabric_save_returns_during_the_write_and_every_rank_loads_only_the_written_checkpoint(report):
    fabric = report["fabric"]
    assert fabric["default_io"] == "BackgroundXLACheckpointIO"
    events = [tuple(event) for event in fabric["events"]]
    assert ("pending after save", "True") in events  # rank 0's fabric.save returned with its write held
    starts = [i for i, event in enumerate(events) if event == ("start", "fabric.ckpt")]
    assert len(starts) == 2
    end = events.index(("end", "fabric.ckpt"), starts[1])  # the second write's end
    assert events.index(("rank 1 loads", "")) < end  # rank 1 was loading while the write was held ...
    reads = [event for event in events if event[0].endswith("read step")]
    assert sorted(reads) == [("rank 0 read step", "1"), ("rank 1 read step", "1")]  # ... and read the new one
    assert all(events.index(read) > end for read in reads)
    assert [name for name in fabric["left"] if name.startswith(".fabric")] == []

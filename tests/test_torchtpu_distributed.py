"""The stand-in's "tpu_dist" process group: two-process DDP on "tpu" equals CPU DDP on gloo bit for bit.

tests/scripts/torchtpu_ddp.py trains the same model under torch's DistributedDataParallel twice in two
spawned processes, on the stand-in "tpu" device over "tpu_dist" and on CPU over gloo (loopback only).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.torchtpu
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "torchtpu_ddp.py")


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def test_two_process_ddp_over_tpu_dist_equals_cpu_ddp_over_gloo(tmp_path):
    output = str(tmp_path / "runs.pt")
    env = dict(os.environ, TORCHTPU_PLUGINS_DEVICE="cpu", MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
    result = subprocess.run(
        [sys.executable, SCRIPT, output, _free_port()], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    runs = torch.load(output)
    tpu, cpu = runs["tpu"], runs["cpu"]
    assert (tpu["device"], tpu["backend"]) == ("tpu", "tpu_dist")
    assert (cpu["device"], cpu["backend"]) == ("cpu", "gloo")
    assert [loss.item() for loss in tpu["losses"]] == [loss.item() for loss in cpu["losses"]]
    assert tpu["state"].keys() == cpu["state"].keys()
    for name, value in cpu["state"].items():
        assert torch.equal(tpu["state"][name], value), name

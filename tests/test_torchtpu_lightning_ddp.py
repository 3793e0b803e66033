"""Lightning's DDP on accelerator="tpu" (stand-in, two devices) equals Lightning's CPU DDP on gloo, rank 0's losses.

tests/scripts/torchtpu_lightning_ddp.py runs one unchanged Lightning script through Lightning's own launcher
(it reruns the script for rank 1), once on accelerator="tpu" with strategy="auto" and once on accelerator="cpu"
with strategy="ddp"; and the same for a Fabric loop. Every address is on the loopback.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from test_torchtpu_distributed import _free_port

pytestmark = pytest.mark.torchtpu
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "torchtpu_lightning_ddp.py")


def _run(api: str, accelerator: str, tmp_path) -> dict:  # type: ignore[no-untyped-def]
    output = str(tmp_path / f"{api}-{accelerator}.pt")
    env = dict(
        os.environ,
        TORCHTPU_PLUGINS_DEVICE="cpu",
        TORCHTPU_PLUGINS_DEVICE_COUNT="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=_free_port(),
        GLOO_SOCKET_IFNAME="lo",
    )
    result = subprocess.run(
        [sys.executable, SCRIPT, api, accelerator, output], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return torch.load(output, weights_only=False)


def test_two_process_ddp_on_tpu_through_lightnings_launcher_equals_cpu_ddp_on_gloo(tmp_path):
    tpu, cpu = _run("trainer", "tpu", tmp_path), _run("trainer", "cpu", tmp_path)
    assert (tpu["strategy"], tpu["backend"], tpu["world_size"]) == ("TorchTPUDDPStrategy", "tpu_dist", 2)
    assert (cpu["strategy"], cpu["backend"], cpu["world_size"]) == ("DDPStrategy", "gloo", 2)
    assert tpu["devices"] == {"tpu"}  # parameters and optimizer state during the fit
    assert len(tpu["losses"]) == 4
    assert tpu["losses"] == cpu["losses"]
    assert tpu["state"].keys() == cpu["state"].keys()
    for name, value in cpu["state"].items():
        assert torch.equal(tpu["state"][name], value), name
    # the checkpoint written during the fit holds CPU tensors, equal to the weights at the end
    checkpoint = torch.load(tmp_path / "trainer-tpu-ckpt" / "last.ckpt", weights_only=False)  # as written
    optimizer_state = checkpoint["optimizer_states"][0]["state"]
    tensors = [*checkpoint["state_dict"].values(), *(v for s in optimizer_state.values() for v in s.values())]
    assert {t.device.type for t in tensors if torch.is_tensor(t)} == {"cpu"}
    for name, value in cpu["state"].items():
        assert torch.equal(checkpoint["state_dict"][name], value), name


def test_two_process_fabric_ddp_on_tpu_equals_fabric_cpu_ddp_on_gloo(tmp_path):
    tpu, cpu = _run("fabric", "tpu", tmp_path), _run("fabric", "cpu", tmp_path)
    assert (tpu["strategy"], tpu["backend"], tpu["world_size"]) == ("FabricTorchTPUDDPStrategy", "tpu_dist", 2)
    assert (cpu["strategy"], cpu["backend"]) == ("DDPStrategy", "gloo")
    assert tpu["devices"] == {"tpu"}
    assert len(tpu["losses"]) == 4
    assert tpu["losses"] == cpu["losses"]
    for name, value in cpu["state"].items():
        assert torch.equal(tpu["state"][name], value), name

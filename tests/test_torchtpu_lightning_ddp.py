"""Lightning's DDP on accelerator="tpu" (stand-in, two devices) equals Lightning's CPU DDP on gloo, rank 0's losses.

tests/scripts/torchtpu_lightning_ddp.py runs one unchanged Lightning script, strategy="ddp" by Lightning's name,
through Lightning's own launcher (it reruns the script for rank 1), once on accelerator="tpu" and once on
accelerator="cpu"; the same for a Fabric loop; and the Trainer with strategy="ddp_spawn" on "tpu" (Lightning's
spawning launcher). Every address is on the loopback.
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


def run_two_processes(script: str, *args: str, output: str) -> dict:
    """Run ``script`` with ``args`` and ``output`` on two stand-in devices (loopback rendezvous); load ``output``."""
    env = dict(
        os.environ,
        TORCHTPU_PLUGINS_DEVICE="cpu",
        TORCHTPU_PLUGINS_DEVICE_COUNT="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=_free_port(),
        GLOO_SOCKET_IFNAME="lo",
    )
    command = [sys.executable, script, *args, output]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return torch.load(output, weights_only=False)


def _run(api: str, accelerator: str, tmp_path, strategy: str = "ddp") -> dict:  # type: ignore[no-untyped-def]
    return run_two_processes(
        SCRIPT, api, accelerator, strategy, output=str(tmp_path / f"{api}-{accelerator}-{strategy}.pt")
    )


@pytest.fixture(scope="module")
def cpu_trainer_ddp(tmp_path_factory) -> dict:  # type: ignore[no-untyped-def]
    """The script's Trainer run on accelerator="cpu", strategy="ddp" (gloo): the reference."""
    cpu = _run("trainer", "cpu", tmp_path_factory.mktemp("cpu"))
    assert (cpu["strategy"], cpu["backend"], cpu["world_size"]) == ("DDPStrategy", "gloo", 2)
    return cpu


def _assert_equal_runs(tpu: dict, cpu: dict) -> None:
    assert tpu["devices"] == {"tpu"}  # parameters and optimizer state during the fit
    assert len(tpu["losses"]) == 4
    assert tpu["losses"] == cpu["losses"]
    assert tpu["state"].keys() == cpu["state"].keys()
    for name, value in cpu["state"].items():
        assert torch.equal(tpu["state"][name], value), name


def test_two_process_ddp_by_lightnings_name_on_tpu_equals_cpu_ddp_on_gloo(tmp_path, cpu_trainer_ddp):
    tpu = _run("trainer", "tpu", tmp_path)
    assert (tpu["strategy"], tpu["backend"], tpu["world_size"]) == ("TorchTPUDDPStrategy", "tpu_dist", 2)
    _assert_equal_runs(tpu, cpu_trainer_ddp)
    # the checkpoint written during the fit holds CPU tensors, equal to the weights at the end
    checkpoint = torch.load(tmp_path / "trainer-tpu-ddp-ckpt" / "last.ckpt", weights_only=False)  # as written
    optimizer_state = checkpoint["optimizer_states"][0]["state"]
    tensors = [*checkpoint["state_dict"].values(), *(v for s in optimizer_state.values() for v in s.values())]
    assert {t.device.type for t in tensors if torch.is_tensor(t)} == {"cpu"}
    for name, value in cpu_trainer_ddp["state"].items():
        assert torch.equal(checkpoint["state_dict"][name], value), name


def test_two_spawned_processes_of_ddp_spawn_on_tpu_equal_cpu_ddp_on_gloo(tmp_path, cpu_trainer_ddp):
    tpu = _run("trainer", "tpu", tmp_path, strategy="ddp_spawn")
    assert (tpu["strategy"], tpu["backend"], tpu["world_size"]) == ("TorchTPUDDPStrategy", "tpu_dist", 2)
    assert tpu["start_method"] == "spawn"
    _assert_equal_runs(tpu, cpu_trainer_ddp)


def test_two_process_fabric_ddp_by_lightnings_name_on_tpu_equals_fabric_cpu_ddp_on_gloo(tmp_path):
    tpu, cpu = _run("fabric", "tpu", tmp_path), _run("fabric", "cpu", tmp_path)
    assert (tpu["strategy"], tpu["backend"], tpu["world_size"]) == ("FabricTorchTPUDDPStrategy", "tpu_dist", 2)
    assert (cpu["strategy"], cpu["backend"]) == ("DDPStrategy", "gloo")
    assert tpu["devices"] == {"tpu"}
    assert len(tpu["losses"]) == 4
    assert tpu["losses"] == cpu["losses"]
    for name, value in cpu["state"].items():
        assert torch.equal(tpu["state"][name], value), name

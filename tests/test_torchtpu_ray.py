"""Ray Train's TorchTrainer (2 workers, local Ray on the loopback) runs one Lightning script on accelerator="tpu".

tests/scripts/torchtpu_ray_train.py runs the same Trainer script and Fabric loop on the stand-in "tpu" device
and on the CPU (Lightning's DDP on Ray's gloo group), in one fresh driver whose own environment has no "tpu"
device: the stand-in's variables reach Ray's workers through ``runtime_env`` only. No ``prepare_trainer``.
Every Ray process the driver started must be gone when it ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid

import pytest
import torch

pytest.importorskip("ray")
pytestmark = pytest.mark.ray
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "torchtpu_ray_train.py")
#: Set in the driver's environment only: every process Ray starts inherits it (its command line may change).
TOKEN_VARIABLE = "TORCHTPU_PLUGINS_RAY_TEST"


def _ray_temporary_files() -> set[str]:
    """Entries of the temporary directory that a Ray run may leave: its session folders, Ray's Lightning checkpoints."""
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith(("ray", "lightning_checkpoints-"))}


def _processes_with(token: str) -> list[int]:
    """The ids of live processes whose initial environment holds ``TOKEN_VARIABLE=token``."""
    found = []
    needle = f"{TOKEN_VARIABLE}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as file:
                if needle in file.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone meanwhile, or a process of another user
            continue
    return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory):  # type: ignore[no-untyped-def]
    output = str(tmp_path_factory.mktemp("torchtpu-ray"))
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHTPU_PLUGINS_DEVICE", "TORCHTPU_PLUGINS_DEVICE_COUNT")}
    # before `import ray`: a local Ray then binds 127.0.0.1 only; gloo binds the loopback
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", GLOO_SOCKET_IFNAME="lo", **{TOKEN_VARIABLE: token})
    temporary_before = _ray_temporary_files()
    result = subprocess.run(
        [sys.executable, SCRIPT, output],
        env=env,
        cwd=output,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-6000:])
    loaded = {
        name: torch.load(os.path.join(output, f"{name}.pt"), weights_only=False) for name in ("tpu", "cpu", "driver")
    }
    loaded["token"] = token
    loaded["temporary_files_left"] = _ray_temporary_files() - temporary_before
    return loaded


def test_workers_get_the_standin_through_runtime_env_and_ray_stays_on_the_loopback(runs):
    assert runs["driver"]["accelerator"] is None  # the driver has no "tpu" device
    env = runs["tpu"]["env"]
    assert (env["TORCHTPU_PLUGINS_DEVICE"], env["TORCHTPU_PLUGINS_DEVICE_COUNT"], env["GLOO_SOCKET_IFNAME"]) == (
        "cpu", "2", "lo"
    )  # fmt: skip
    assert runs["driver"]["gcs_address"].startswith("127.0.0.1:")
    assert runs["driver"]["node"] == "127.0.0.1"  # the node's address (raylet, workers)


def test_trainer_ddp_on_tpu_under_ray_equals_cpu_ddp_under_ray(runs):
    tpu, cpu = runs["tpu"]["trainer"], runs["cpu"]["trainer"]
    # Ray's gloo group is kept; DDP reduces over a "tpu_dist" group of the same ranks
    assert (tpu["strategy"], tpu["world_backend"], tpu["ddp_backend"]) == ("TorchTPUDDPStrategy", "gloo", "tpu_dist")
    assert (cpu["strategy"], cpu["backend"], cpu["world_backend"], cpu["ddp_backend"]) == (
        "DDPStrategy", "gloo", "gloo", "gloo"
    )  # fmt: skip
    assert (tpu["world_size"], tpu["ranks"]) == (cpu["world_size"], cpu["ranks"]) == (2, (0, 0, 0))
    assert tpu["devices"] == {"tpu"}  # parameters and optimizer state during the fit
    assert len(tpu["losses"]) == 4
    assert tpu["losses"] == cpu["losses"]
    # the strategy's reduce (sum) and all_gather of a "tpu" tensor, over both ranks
    assert (tpu["reduced"].tolist(), tpu["gathered"].tolist()) == (cpu["reduced"].tolist(), cpu["gathered"].tolist())
    assert (tpu["reduced"].tolist(), tpu["gathered"].tolist()) == ([3.0], [[1.0], [2.0]])
    assert tpu["state"].keys() == cpu["state"].keys()
    for name, value in cpu["state"].items():
        assert torch.equal(tpu["state"][name], value), name


def test_rays_result_checkpoint_loads_on_cpu_with_the_trained_weights(runs):
    driver, tpu = runs["driver"], runs["tpu"]["trainer"]
    assert driver["checkpoint_devices"] == {"cpu"}  # torch.load without map_location, in a driver without "tpu"
    assert driver["model_device"] == "cpu"
    for name, value in tpu["state"].items():
        assert torch.equal(driver["checkpoint_state"][name], value), name
    assert (driver["metrics"]["epoch"], driver["metrics"]["step"]) == (0, 4)
    assert driver["metrics"]["train_loss"] == pytest.approx(tpu["losses"][-1])


def test_prepare_trainer_refuses_lightnings_and_our_ddp_strategies(runs):
    """prepare_trainer only checks classes (Ray's own strategies, RayLightningEnvironment): not needed."""
    for run, strategy in ((runs["tpu"], "torchtpu_plugins.strategies.ddp.TorchTPUDDPStrategy"),
                          (runs["cpu"], "lightning.pytorch.strategies.ddp.DDPStrategy")):  # fmt: skip
        assert run["trainer"]["prepare_trainer"] == (
            f"Invalid strategy class: <class '{strategy}'>. To use PyTorch Lightning with Ray, the strategy object"
            " should be one of ['RayDDPStrategy', 'RayFSDPStrategy', 'RayDeepSpeedStrategy'] class or its subclass."
        )


def test_fabric_ddp_on_tpu_under_ray_equals_fabric_cpu_ddp_under_ray(runs):
    tpu, cpu = runs["tpu"]["fabric"], runs["cpu"]["fabric"]
    assert (tpu["strategy"], tpu["world_backend"], tpu["ddp_backend"]) == (
        "FabricTorchTPUDDPStrategy",
        "gloo",
        "tpu_dist",
    )
    assert (cpu["strategy"], cpu["backend"], cpu["ddp_backend"]) == ("DDPStrategy", "gloo", "gloo")
    assert (tpu["world_size"], tpu["ranks"]) == (2, (0, 0, 0))
    assert tpu["devices"] == {"tpu"}
    assert len(tpu["losses"]) == 4
    assert tpu["losses"] == cpu["losses"]
    for name, value in cpu["state"].items():
        assert torch.equal(tpu["state"][name], value), name
    # fabric.all_reduce (sum) and all_gather of a "tpu" tensor, over both ranks
    assert (tpu["reduced"].tolist(), tpu["gathered"].tolist()) == ([3.0], [[1.0], [2.0]])
    assert (cpu["reduced"].tolist(), cpu["gathered"].tolist()) == ([3.0], [[1.0], [2.0]])


def test_no_ray_process_outlives_the_driver(runs):
    """Every process of the driver's Ray (GCS, raylet, workers, actors) is gone (looked for 20 times, 0.5 s apart)."""
    for _ in range(20):
        left = _processes_with(runs["token"])
        if not left:
            break
        time.sleep(0.5)
    assert left == []
    # nothing left in the temporary directory: Ray's session folder, RayTrainReportCallback's folders (in TMPDIR)
    assert runs["temporary_files_left"] == set()

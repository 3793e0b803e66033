"""One Lightning script and one Fabric loop trained by Ray Train's ``TorchTrainer`` (2 workers) on a local Ray.

Usage: ``python torchtpu_ray_train.py OUTPUT_DIR``, or ``python torchtpu_ray_train.py --num_workers=N SCRIPT
ARGS... OUTPUT_DIR`` for the launch matrix (tests/test_torchtpu_launch_matrix.py): Ray's N workers run
``SCRIPT``'s ``main(ARGS + [OUTPUT_DIR], plugins=[RayLightningEnvironment()])``, as torchrun runs a script
(the script's files go to OUTPUT_DIR, which is also where Ray's results go). The driver starts a local Ray on the
loopback (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` must be set before this script imports ray), runs
``TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2))`` once and shuts Ray down. No
``prepare_trainer``: the Trainer gets ``plugins=[RayLightningEnvironment()]`` and
``callbacks=[RayTrainReportCallback()]`` only. The stand-in device's variables reach the workers through
Ray's ``runtime_env`` alone: the driver itself has no ``"tpu"`` device.

Each worker trains the Trainer script, then the Fabric loop, first with ``accelerator="cpu"``, then with
``accelerator="tpu"``, both with Lightning's ``strategy="ddp"`` (on ``"tpu"`` torchtpu-plugins' DDP), all
in the same processes over the process group Ray made (one fit: Ray starts its workers once); the run's
checkpoint is the last one reported, the ``"tpu"`` Trainer's. Rank 0 saves ``OUTPUT_DIR/{accelerator}.pt``:
per API the losses of rank 0's batches, the final state (CPU tensors), the strategy's class and
``_process_group_backend``, the backends of the default group and of the group DDP reduced over, the
device types seen during the fit, world size and ranks, a sum and a gather of each rank's number, and
what ``ray.train.lightning.prepare_trainer`` said of the Trainer. The driver saves
``OUTPUT_DIR/driver.pt``: the Ray result's checkpoint loaded on the CPU, its metrics, the GCS address
and the driver's accelerator. Ray's session folder is removed after ``ray.shutdown()``; the workers'
``TMPDIR`` is ``OUTPUT_DIR/worker_tmp`` (``RayTrainReportCallback`` leaves folders in it).
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import ray
import torch
import torch.distributed as dist
import torchtpu_lightning_ddp
from ray.train import RunConfig, ScalingConfig
from ray.train.lightning import RayLightningEnvironment, RayTrainReportCallback, prepare_trainer
from ray.train.torch import TorchTrainer
from torch import nn
from torchtpu_lightning_ddp import _loader

#: What the workers need before ``import torch``: the stand-in device, gloo on the loopback, and this
#: directory on the path (the model class of torchtpu_lightning_ddp.py, which Ray pickles by reference).
WORKER_ENV = {
    "TORCHTPU_PLUGINS_DEVICE": "cpu",
    "TORCHTPU_PLUGINS_DEVICE_COUNT": "2",
    "GLOO_SOCKET_IFNAME": "lo",
    "PYTHONPATH": os.path.dirname(os.path.abspath(__file__)),
}


class Regression(torchtpu_lightning_ddp.Regression):
    """The DDP test's model, logging its loss (``RayTrainReportCallback`` reports the logged metrics).

    At the end of the fit it runs the strategy's ``reduce`` (sum) and ``all_gather`` of a tensor on its device.
    """

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        return loss

    def on_train_end(self) -> None:
        rank = torch.tensor([float(self.global_rank + 1)], device=self.device)
        self.collectives = {
            "reduced": self.trainer.strategy.reduce(rank.clone(), reduce_op="sum").cpu(),
            "gathered": self.all_gather(rank).cpu(),
        }


def _ddp_backend(ddp: object) -> str:
    """The backend of the group ``DistributedDataParallel`` ``ddp`` reduces gradients over."""
    return str(dist.get_backend(ddp.process_group))  # type: ignore[attr-defined]


def _describe(model: nn.Module, strategy: object, losses: list[float], devices: set[str], ddp_backend: str) -> dict:
    return {
        "losses": losses,
        "state": {name: value.detach().cpu() for name, value in model.state_dict().items()},
        "strategy": type(strategy).__name__,
        "backend": strategy._process_group_backend,  # type: ignore[attr-defined]
        "world_backend": str(dist.get_backend()),
        "ddp_backend": ddp_backend,
        "devices": devices,
        "world_size": strategy.world_size,  # type: ignore[attr-defined]
        "ranks": (strategy.global_rank, strategy.local_rank, strategy.node_rank),  # type: ignore[attr-defined]
    }


def _trainer_run(accelerator: str) -> dict:
    L.seed_everything(0, verbose=False)
    model = Regression()
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=2,
        strategy="ddp",
        max_epochs=1,
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        prepare_trainer(trainer)
        prepared = "accepted"
    except RuntimeError as error:
        prepared = str(error)
    ddp_backend: list[str] = []

    class _DDPBackend(L.Callback):  # read during the fit: the strategy's own "tpu_dist" group ends with it
        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            ddp_backend.append(_ddp_backend(trainer.strategy.model))

    trainer.callbacks.append(_DDPBackend())
    trainer.fit(model, _loader())
    run = _describe(model, trainer.strategy, model.losses, model.devices_seen, ddp_backend[0])
    run["prepare_trainer"] = prepared
    run.update(model.collectives)
    return run


def _fabric_run(accelerator: str) -> dict:
    fabric = L.Fabric(accelerator=accelerator, devices=2, strategy="ddp", plugins=[RayLightningEnvironment()])
    fabric.launch()
    model, module, devices = torchtpu_lightning_ddp.fabric_fit(fabric)
    run = _describe(model, fabric.strategy, model.losses, devices, _ddp_backend(module._forward_module))
    rank = torch.tensor([float(fabric.global_rank + 1)], device=fabric.device)
    run["reduced"] = fabric.all_reduce(rank.clone(), reduce_op="sum").cpu()
    run["gathered"] = fabric.all_gather(rank).cpu()
    fabric.strategy.teardown()
    return run


def train_func(config: dict) -> None:
    for accelerator in ("cpu", "tpu"):
        runs = {
            "env": {name: os.environ.get(name) for name in WORKER_ENV},
            "trainer": _trainer_run(accelerator),
            "fabric": _fabric_run(accelerator),
        }
        if ray.train.get_context().get_world_rank() == 0:
            torch.save(runs, os.path.join(config["output"], f"{accelerator}.pt"))


@contextmanager
def local_ray(output: str, num_workers: int) -> Iterator[None]:
    """A local Ray on the loopback for ``num_workers`` stand-in workers; shut down after, its session folder removed."""
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    # the workers' TMPDIR: RayTrainReportCallback leaves its checkpoint folders' parents in the temporary directory
    worker_tmp = os.path.join(output, "worker_tmp")
    os.makedirs(worker_tmp)
    env_vars = {**WORKER_ENV, "TORCHTPU_PLUGINS_DEVICE_COUNT": str(num_workers), "TMPDIR": worker_tmp}
    ray.init(num_cpus=4, include_dashboard=False, _temp_dir=temp_dir, runtime_env={"env_vars": env_vars})
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir)  # Ray's session folder: logs and sockets


def fit(function: Callable[[dict], None], config: dict, output: str, num_workers: int) -> Any:
    """Ray Train's ``TorchTrainer(function, ...)`` of ``num_workers`` workers, results under ``output``: its result."""
    trainer = TorchTrainer(
        function,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(name="fit", storage_path=os.path.join(output, "ray_results")),
    )
    return trainer.fit()


def script_func(config: dict) -> None:
    """Run the script ``config["script"]``'s ``main(config["args"], plugins=[RayLightningEnvironment()])``."""
    runpy.run_path(config["script"])["main"](config["args"], plugins=[RayLightningEnvironment()])


def main(output: str) -> None:
    with local_ray(output, 2):
        driver = {
            "accelerator": torch.accelerator.current_accelerator(),
            "node": ray.nodes()[0]["NodeManagerAddress"],
        }
        result = fit(train_func, {"output": output}, output, 2)
        with result.checkpoint.as_directory() as directory:
            path = os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME)
            checkpoint = torch.load(path, weights_only=False)  # no map_location: the tensors are on the CPU
            model = Regression.load_from_checkpoint(path)
        driver["checkpoint_devices"] = {v.device.type for v in checkpoint["state_dict"].values()}
        driver["checkpoint_state"] = {name: value.clone() for name, value in model.state_dict().items()}
        driver["model_device"] = model.device.type
        driver["metrics"] = result.metrics
        driver["gcs_address"] = ray.get_runtime_context().gcs_address
        torch.save(driver, os.path.join(output, "driver.pt"))


if __name__ == "__main__":
    if sys.argv[1].startswith("--num_workers="):  # a script of the launch matrix: Ray starts it, as torchrun would
        workers, script, *args = sys.argv[1:]
        output_dir = args[-1]
        with local_ray(output_dir, int(workers.split("=")[1])):
            fit(script_func, {"script": script, "args": args}, output_dir, int(workers.split("=")[1]))
    else:
        main(sys.argv[1])

"""Two-process DDP of one small model, on the stand-in "tpu" device over "tpu_dist" and on CPU over gloo.

Usage: ``python torchtpu_ddp.py OUTPUT PORT`` with TORCHTPU_PLUGINS_DEVICE=cpu in the environment (the
spawned processes read it at ``import torch``). Spawns two processes (loopback rendezvous on
127.0.0.1:PORT, gloo on ``lo``); each trains the same model twice under
``torch.nn.parallel.DistributedDataParallel`` (no ``device_ids``, as TorchTPU's DDP runs) on its own
batches: on "tpu" in the default "tpu_dist" group, then on CPU in a gloo group. Rank 0 saves
``{"tpu": run, "cpu": run}`` to OUTPUT, each run ``{"losses", "state" (CPU tensors), "device", "backend"}``.
A plain SGD update keeps ``torch.optim`` (and the torch._dynamo import it costs) out of the processes.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 5
LEARNING_RATE = 0.1


def _train(device: torch.device, rank: int, group: dist.ProcessGroup) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    data = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(4, 8, generator=data).to(device)
        y = torch.randn(4, 1, generator=data).to(device)
        ddp.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.sub_(LEARNING_RATE * parameter.grad)
        losses.append(loss.detach().cpu())
    return {
        "losses": losses,
        "state": {name: value.cpu() for name, value in model.state_dict().items()},
        "device": next(model.parameters()).device.type,
        "backend": dist.get_backend(group),
    }


def _worker(rank: int, output: str, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("tpu_dist", rank=rank, world_size=2)
    try:
        runs = {"tpu": _train(torch.device("tpu"), rank, dist.group.WORLD)}
        runs["cpu"] = _train(torch.device("cpu"), rank, dist.new_group(backend="gloo"))
        if rank == 0:
            torch.save(runs, output)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_worker, args=(sys.argv[1], sys.argv[2]), nprocs=2)

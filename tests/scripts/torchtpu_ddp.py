"""Two-process DDP of one small model, on the stand-in "tpu" device over "tpu_dist" or on CPU over gloo.

Usage: ``python torchtpu_ddp.py {tpu,cpu} OUTPUT PORT``. Spawns two processes (loopback rendezvous on
127.0.0.1:PORT), trains five SGD steps with momentum on each rank's own batches under
``torch.nn.parallel.DistributedDataParallel`` (no ``device_ids``, as TorchTPU's DDP runs), and rank 0
saves ``{"losses": [...], "state": {...}, "device": ...}`` (CPU tensors) to OUTPUT. The "tpu" run needs
TORCHTPU_PLUGINS_DEVICE=cpu in the environment (the children read it at ``import torch``).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 5


def _worker(rank: int, device_type: str, output: str, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GLOO_SOCKET_IFNAME="lo")
    backend = "tpu_dist" if device_type == "tpu" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=2)
    try:
        device = torch.device(device_type)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        data = torch.Generator().manual_seed(100 + rank)
        losses = []
        for _ in range(STEPS):
            x = torch.randn(4, 8, generator=data).to(device)
            y = torch.randn(4, 1, generator=data).to(device)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().cpu())
        parameter_device = next(model.parameters()).device.type
        state = {name: value.cpu() for name, value in model.state_dict().items()}
        if rank == 0:
            torch.save({"losses": losses, "state": state, "device": parameter_device, "backend": backend}, output)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_worker, args=(sys.argv[1], sys.argv[2], sys.argv[3]), nprocs=2)

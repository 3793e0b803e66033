"""Can several PJRT CPU processes form one XLA world? (the check recorded in docs/testing.md)

Run: ``python tests/scripts/cpu_world_check.py`` with the tox environment's Python. It starts two
processes with ``PJRT_DEVICE=CPU`` in three ways, each under a timeout, and prints what
``torch_xla.runtime`` reports in each process:

* ``plain``: two independent processes (``PJRT_LOCAL_PROCESS_COUNT=2``, ranks 0 and 1);
* ``dist_service``: the same plus ``PJRT_DIST_SERVICE_ADDR=localhost:<port>`` (the variable torch_xla
  names for the distributed runtime service);
* ``xla_init``: ``torch.distributed.init_process_group("xla", init_method="xla://")`` with
  ``MASTER_ADDR``/``MASTER_PORT``, ``WORLD_SIZE``/``RANK`` set as torchrun would, then an all-reduce
  on the XLA device.

One world would mean ``process_count() == 2`` and ``global_device_count() == 2`` in each process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

CHILD = r"""
import json, os, sys
mode = sys.argv[1]
import torch, torch_xla, torch_xla.runtime as xr
out = {"rank": os.environ["PJRT_LOCAL_PROCESS_RANK"], "torch_xla": torch_xla.__version__}
if mode == "xla_init":
    import torch.distributed as dist
    import torch_xla.distributed.xla_backend  # registers the "xla" backend
    try:
        dist.init_process_group("xla", init_method="xla://")
        t = torch.ones(1, device=torch_xla.device())
        dist.all_reduce(t)
        torch_xla.sync()
        out["all_reduce"] = t.item()
        out["dist_world_size"] = dist.get_world_size()
    except Exception as error:  # reported, not raised
        out["error"] = f"{type(error).__name__}: {str(error)[:300]}"
for name in ("process_count", "process_index", "global_device_count", "addressable_device_count", "world_size"):
    try:
        out[name] = getattr(xr, name)()
    except Exception as error:
        out[name] = f"{type(error).__name__}: {str(error)[:200]}"
print(json.dumps(out), flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run(mode: str, timeout: float = 90.0) -> None:
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="1", PJRT_LOCAL_PROCESS_COUNT="2")
        env["PJRT_LOCAL_PROCESS_RANK"] = str(rank)
        if mode == "dist_service":
            env["PJRT_DIST_SERVICE_ADDR"] = f"localhost:{port}"
        if mode == "xla_init":
            env.update(MASTER_ADDR="localhost", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank))
            env.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", CHILD, mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=timeout)
            tail = err.strip()[-300:]
            line = out.strip().splitlines()[-1] if out.strip() else f"(no output; rc={proc.returncode}; {tail!r})"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            line = f"(timed out after {timeout:.0f} s)"
        print(f"{mode} rank {rank}: {line}", flush=True)


if __name__ == "__main__":
    for mode in sys.argv[1:] or ("plain", "dist_service", "xla_init"):
        run(mode)

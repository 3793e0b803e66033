"""One simulated host of a 2-host slice fits with xla_spmd (tests/test_pod_slices.py runs two of these).

Usage: ``python pod_fit.py RANK DIR [HOSTS [CHECKPOINT]]``. The host's figures come from the test double
(``tests/simulated_pod.py``: HOSTS hosts x 4 devices, default 2); with CHECKPOINT, the fit resumes
from it for one more epoch; the hosts' process group is a real gloo group over
a file store in ``DIR``; each process runs real torch_xla SPMD on its own 4 PJRT CPU devices. The
processes do not form one XLA world (torch_xla cannot join CPU processes), so their gradients are not
reduced across hosts: this checks the multi-host Trainer path (sampler over the hosts, each host's
share sent with minibatch sharding, ranks, rank-zero logging and checkpointing, collectives over the
hosts), not cross-host training values. Prints one JSON line. With ``STOP_HOST``/``STOP_AT`` one host
sends itself SIGTERM during training; each host prints the global step at which it stopped.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from simulated_pod import Slice, on_host  # noqa: E402

RANK, DIR = int(sys.argv[1]), sys.argv[2]
HOSTS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
CHECKPOINT = sys.argv[4] if len(sys.argv) > 4 else None
POD = Slice(f"{HOSTS} hosts x 4 chips", HOSTS, 4)
#: STOP_HOST=r STOP_AT=s: host r sends itself SIGTERM in training_step at global step s (64 x 4 samples then)
STOP_HOST, STOP_AT = int(os.environ.get("STOP_HOST", "-1")), int(os.environ.get("STOP_AT", "-1"))
SAMPLES = 256 if STOP_HOST >= 0 else 64


def main() -> None:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    os.makedirs(DIR, exist_ok=True)
    dist.init_process_group("gloo", init_method=f"file://{DIR}/store", world_size=POD.hosts, rank=RANK)
    seen: list[int] = []

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            if RANK == STOP_HOST and self.global_step == STOP_AT:
                os.kill(os.getpid(), signal.SIGTERM)  # a stop signal to this host only
            index = batch[0]
            seen.extend(index.cpu().tolist())
            loss = self.layer(index.float().unsqueeze(1)).pow(2).mean()
            self.log("loss", loss, sync_dist=True)
            # host values: a CPU tensor is reduced over the hosts; a number becomes an XLA tensor, which
            # SPMD takes to be global (the same on every host), so it is not
            self.log("host_tensor", torch.tensor(float(RANK + 1)), sync_dist=True, reduce_fx="sum")
            self.log("host_number", float(RANK + 1), sync_dist=True, reduce_fx="sum")
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    class ReportsTheStop(L.Callback):
        def on_exception(self, trainer, pl_module, exception):
            print(json.dumps({"rank": RANK, "stopped_at": trainer.global_step}), flush=True)

    with on_host(POD.host(RANK)):
        trainer = L.Trainer(
            callbacks=[ReportsTheStop()],
            accelerator="xla",
            devices=4,
            strategy="xla_spmd",
            max_epochs=1 if CHECKPOINT is None else 2,
            default_root_dir=DIR,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        loader = DataLoader(TensorDataset(torch.arange(SAMPLES)), batch_size=2)
        trainer.fit(Model(), loader, ckpt_path=CHECKPOINT)
        out = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "num_nodes": trainer.num_nodes,
            "is_global_zero": trainer.is_global_zero,
            "seen": seen,
            "steps": trainer.global_step,
            "host_tensor": float(trainer.callback_metrics["host_tensor"]),
            "host_number": float(trainer.callback_metrics["host_number"]),
            "checkpoint": trainer.checkpoint_callback.best_model_path if RANK == 0 else None,
            "epoch": trainer.current_epoch,
        }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

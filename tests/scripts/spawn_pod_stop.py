"""One simulated host of a 2-host slice fits with the spawn strategy ("xla"); tests/test_pod_slices.py runs two.

Usage: ``python spawn_pod_stop.py HOST DIR``. Each host is one worker process driving 2 PJRT CPU
devices as replica threads (tests/xla_cpu_harness.py); the replicas' figures come from the test
double (``tests/simulated_pod.py``: 2 hosts x 2 devices, one process per host with a thread per
device), so each replica sees a world of 4 ranks over 2 hosts. The leading replicas of the two
hosts' workers form the stop agreement's real gloo group over a file store in ``DIR`` (where a pod
uses the store of torch_xla's ``xla://`` rendezvous). The two hosts' devices do not form one XLA world
(torch_xla cannot join CPU processes), so nothing but that group couples the hosts: this checks the
stop agreement, not cross-host training values. With ``STOP_HOST``/``STOP_AT``, the replica of
local rank 0 on host ``STOP_HOST`` sends SIGTERM to its host's main process in ``training_step`` at
global step ``STOP_AT``. Every replica writes ``DIR/rank<N>.json``: its host, rank and the global step
at which it stopped (when it builds the stop checkpoint), or at which training ended.
"""

from __future__ import annotations

import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import xla_cpu_harness  # noqa: E402

xla_cpu_harness.install()

import lightning as L  # noqa: E402
import torch  # noqa: E402
from simulated_pod import PER_HOST_THREADS, Slice  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from xla_plugins.long_runs import _stop_agreement  # noqa: E402
from xla_plugins.testing import simulated_runtime  # noqa: E402

HOST, DIR = int(sys.argv[1]), sys.argv[2]
POD = Slice("2 hosts x 2 devices", 2, 2)
STOP_HOST, STOP_AT = int(os.environ.get("STOP_HOST", "-1")), int(os.environ.get("STOP_AT", "-1"))


MAIN_PROCESS = os.getpid()


def figures():
    """This replica thread's figures on the simulated slice (the main process, where the XLA runtime must not
    start before the workers do, reads those of the host's first device)."""
    if os.getpid() == MAIN_PROCESS:
        return POD.replica(HOST, 0, PER_HOST_THREADS)
    import torch_xla

    return POD.replica(HOST, torch_xla.device().index, PER_HOST_THREADS)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        if HOST == STOP_HOST and self.local_rank == 0 and self.global_step == STOP_AT:
            os.kill(os.getppid(), signal.SIGTERM)  # this host's main process only
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class ReportsTheStop(L.Callback):
    def report(self, trainer: L.Trainer, how: str) -> None:
        line = {"host": HOST, "rank": trainer.global_rank, "how": how, "global_step": trainer.global_step}
        with open(os.path.join(DIR, f"rank{trainer.global_rank}.json"), "w") as file:
            json.dump(line, file)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):  # checkpointing is off: the stop checkpoint
        self.report(trainer, "stopped")

    def on_train_end(self, trainer, pl_module):
        self.report(trainer, "ended")


def main() -> None:
    os.makedirs(DIR, exist_ok=True)
    # the worker processes' group meets in a file store (on a pod: torch_xla's xla:// rendezvous, which the
    # simulated hosts cannot use: each one's torch_xla knows only itself); the forked workers inherit this
    _stop_agreement.RENDEZVOUS = f"file://{DIR}/store"
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32 * POD.devices, 4), torch.randn(32 * POD.devices, 1))
    with simulated_runtime(figures):
        trainer = L.Trainer(
            callbacks=[ReportsTheStop()],
            accelerator="xla",
            devices="auto",
            strategy="xla",
            max_epochs=1,
            default_root_dir=DIR,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            logger=False,
        )
        trainer.fit(Model(), DataLoader(data, batch_size=2))


if __name__ == "__main__":
    main()

"""One replica of a 4-device spawn run raises; report what the main process sees, as JSON on stdout."""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import xla_cpu_harness  # noqa: E402

xla_cpu_harness.install()

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

PID_DIR = sys.argv[1]


class GivesUp(L.LightningModule):
    """Rank 1 raises at its second step; every replica first writes its process id."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        if batch_idx == 0:
            # written once and renamed into place: a replica stopped by the supervisor between a truncating
            # open and the write (the file rewritten at every step) left an empty file, and int("") failed
            # the report (seen under load)
            path = os.path.join(PID_DIR, f"rank{self.global_rank}.pid")
            with open(f"{path}.tmp", "w") as file:
                file.write(str(os.getpid()))
            os.replace(f"{path}.tmp", path)
        if self.global_rank == 1 and batch_idx == 1:
            raise ValueError("rank 1 gave up at step 1")
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid`` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8)
    trainer = L.Trainer(
        accelerator="xla",
        devices=4,
        strategy="xla",
        precision="bf16-true",
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    report: dict[str, object] = {"children_before": children(os.getpid())}  # e.g. torch's compile workers
    try:
        trainer.fit(GivesUp(), data)
    except ValueError as error:
        report["error"] = repr(error)
        report["cause"] = type(error.__cause__).__name__
        report["traceback"] = str(error.__cause__)
    time.sleep(1)
    pid_files = [name for name in os.listdir(PID_DIR) if name.endswith(".pid")]
    worker_pids = sorted({int(open(os.path.join(PID_DIR, name)).read()) for name in pid_files})
    report["worker_pids"] = worker_pids
    report["workers_alive"] = [pid for pid in worker_pids if alive(pid)]
    report["children_after"] = children(os.getpid())
    report["precision_variables"] = {name: os.environ.get(name) for name in ("XLA_USE_BF16", "XLA_USE_F16")}
    report["main_pid"] = os.getpid()
    print(json.dumps(report))

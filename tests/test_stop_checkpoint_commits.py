"""The checkpoint of a run told to stop, on an object store: complete only once committed (fsspec's ``memory://``).

An object store has no atomic rename: the stop checkpoint, written under ``last-stopped.ckpt.partial``
and then moved to ``last-stopped.ckpt``, counts for ``ckpt_path="last"`` only once its commit marker
``last-stopped.ckpt.commit`` is written after the move. The run is a script in its own process (the
memory filesystem lives in that process): it sends itself SIGTERM from ``training_step``.
"""

from __future__ import annotations

import json

import fsspec
import pytest
from conftest import run_python

from trainer_plugins.long_runs import _stop_checkpoint

pytestmark = pytest.mark.xla

SCRIPT = """
import json, os, signal
import fsspec, torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset

ROOT = "memory://stop-commits/run"
STOP = ROOT + "/checkpoints/last-stopped.ckpt"
fs = fsspec.filesystem("memory")


class Model(L.LightningModule):
    def __init__(self, stop_at=-1):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.stop_at, self.started_at = stop_at, None

    def training_step(self, batch, batch_idx):
        if self.global_step == self.stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_train_start(self):
        self.started_at = self.global_step

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data():
    generator = torch.Generator().manual_seed(0)
    samples = TensorDataset(torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator))
    return DataLoader(samples, batch_size=4)


def fit(stop_at=-1, **kwargs):
    trainer = L.Trainer(
        accelerator="xla", devices=1, strategy="single_xla", max_steps=8, default_root_dir=ROOT, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    model = Model(stop_at)
    try:
        trainer.fit(model, data(), **kwargs)
    except SystemExit as stopped:
        return {"exit": stopped.code}
    return {"started_at": model.started_at}


def listing():
    return sorted(p.rsplit("/", 1)[1] for p in fs.ls(ROOT + "/checkpoints", detail=False))


report = {"stopped": fit(stop_at=3), "listing": listing()}
with fs.open(STOP + ".commit", "rb") as marker:
    report["marker"] = marker.read().decode()
report["size"] = fs.size(STOP)
report["resumed"] = fit(ckpt_path="last")
report["listing_after_the_resumed_fit"] = listing()  # a fit that ends normally removes the stop checkpoint

fit(stop_at=3)
fs.rm(STOP + ".commit")  # a process killed after the move, before the marker
report["uncommitted"] = fit(ckpt_path="last")
print(json.dumps(report))
"""


@pytest.mark.slow  # two fits and two stops in a subprocess: primary tox cell only (tox.ini)
def test_on_an_object_store_the_stop_checkpoint_counts_for_ckpt_path_last_only_once_committed():
    report = json.loads(run_python(SCRIPT, env={"PJRT_DEVICE": "CPU"}, timeout=600).stdout.splitlines()[-1])
    assert report["stopped"] == {"exit": 143}
    assert report["listing"] == ["last-stopped.ckpt", "last-stopped.ckpt.commit"]  # no .partial, no stray marker
    assert report["marker"] == str(report["size"])
    assert report["resumed"] == {"started_at": 4}  # the step in flight (3) finished before the checkpoint
    assert report["listing_after_the_resumed_fit"] == []
    assert report["uncommitted"] == {"started_at": 0}  # skipped: "last" found nothing complete


def test_a_stop_checkpoint_directory_moved_on_an_object_store_is_committed_with_its_size():
    fs = fsspec.filesystem("memory")
    root = "memory://stop-commits-move"
    for name, text in (("meta.pt", b"metadata"), ("__0_0.distcp", b"shards")):
        with fs.open(f"{root}/last-stopped.ckpt.partial/{name}", "wb") as stream:
            stream.write(text)
    with fs.open(f"{root}/last-stopped.ckpt.partial.commit", "wb") as stream:
        stream.write(b"14")  # what the atomic write left beside the directory it wrote
    try:
        _stop_checkpoint.move(f"{root}/last-stopped.ckpt.partial", f"{root}/last-stopped.ckpt")
        assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(root, detail=False)) == [
            "last-stopped.ckpt",
            "last-stopped.ckpt.commit",
        ]
        with fs.open(f"{root}/last-stopped.ckpt.commit", "rb") as marker:
            assert marker.read() == b"14"
        from xla_plugins.checkpoints.checkpoint_io import is_committed

        assert is_committed(f"{root}/last-stopped.ckpt")
    finally:
        fs.rm(root, recursive=True)

"""Atomic background checkpoint writes, the same test code on both backends (trainer_plugins.long_runs).

Each test takes ``backend``: ``xla`` (the XLA plugin's ``single_xla`` on PJRT CPU, marked ``xla``) or
``torchtpu`` (the TorchTPU plugin's single-device strategy on the stand-in ``"tpu"`` device, marked
``torchtpu``: the torchtpu-torch* tox cells); a cell without that backend skips the case, saying why.
Every fit runs in-process.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

L = pytest.importorskip("lightning")
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from trainer_plugins.long_runs import _commits  # noqa: E402
from trainer_plugins.long_runs._checkpoint_io import AtomicCheckpointIO, BackgroundCheckpointIO  # noqa: E402

BACKENDS = [pytest.param("xla", marks=pytest.mark.xla), pytest.param("torchtpu", marks=pytest.mark.torchtpu)]
ACCELERATOR = {"xla": "xla", "torchtpu": "tpu"}
STEPS = 6


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(4 * STEPS, 4, generator=generator), torch.randn(4 * STEPS, 1)), 4)


def trainer(backend: str, root: Path, **flags) -> L.Trainer:  # type: ignore[no-untyped-def]
    defaults = dict(
        accelerator=ACCELERATOR[backend],
        devices=1,
        max_steps=STEPS,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return L.Trainer(**{**defaults, **flags})


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_strategy_writes_checkpoints_atomically_in_the_background_by_default(backend, tmp_path):
    io = trainer(backend, tmp_path).strategy.checkpoint_io
    assert isinstance(io, BackgroundCheckpointIO)
    assert isinstance(io.checkpoint_io, AtomicCheckpointIO)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_save_of_a_fit_is_written_on_the_writer_thread_and_fit_returns_after_the_last(
    backend, tmp_path, monkeypatch
):
    """Each ModelCheckpoint save (one a step) reaches torch.save on a thread other than the training thread; when
    ``fit`` returns the last one is complete, no temporary file is left, and it holds the final CPU weights."""
    writers: list[str] = []
    write_to = AtomicCheckpointIO._write_to

    def recording(self, checkpoint, stream):  # type: ignore[no-untyped-def]
        writers.append(threading.current_thread().name)
        write_to(self, checkpoint, stream)

    monkeypatch.setattr(AtomicCheckpointIO, "_write_to", recording)
    dirpath = tmp_path / "checkpoints"
    callback = ModelCheckpoint(dirpath=dirpath, filename="{step}", every_n_train_steps=1, save_top_k=-1)
    model = Model()
    trainer(backend, tmp_path, callbacks=[callback]).fit(model, loader())
    assert len(writers) == STEPS
    assert threading.main_thread().name not in writers
    files = list(dirpath.iterdir())
    assert len(files) == STEPS and not any(path.name.startswith(".") for path in files)  # no temporary file left
    last = max(dirpath.iterdir(), key=lambda path: path.stat().st_mtime_ns)
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["global_step"] == STEPS
    for name, tensor in model.state_dict().items():
        assert checkpoint["state_dict"][name].device.type == "cpu"
        assert torch.equal(checkpoint["state_dict"][name], tensor.cpu()), name


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_write_that_fails_leaves_the_earlier_checkpoint_and_no_temporary_file(backend, tmp_path, monkeypatch):
    """Atomic: a save that fails while serialising (after a first save of the same name) leaves the first file as it
    was, removes its temporary file, and the error reaches the training thread."""
    path = tmp_path / "saved" / "model.ckpt"
    fit = trainer(backend, tmp_path)
    fit.fit(Model(), loader())
    fit.save_checkpoint(path)
    before = path.read_bytes()

    def failing(self, checkpoint, stream):  # type: ignore[no-untyped-def]
        stream.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(AtomicCheckpointIO, "_write_to", failing)
    with pytest.raises(OSError, match="disk full"):
        fit.save_checkpoint(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.ckpt"]
    assert _commits.is_committed(path)


def test_under_an_engine_that_reads_each_save_a_save_inside_a_loop_waits_for_its_write():
    # Ray Train's report callback hands the checkpoint's folder to ray.train.report right after the save
    # (tests/test_torchtpu_ray.py runs it for real); Ray is not installed here, so an environment class
    # of the same package stands in for RayLightningEnvironment
    from types import SimpleNamespace

    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.trainer.states import TrainerStatus

    from trainer_plugins.long_runs._background_checkpoints import WritesCheckpointsInBackground, engine_reads_each_save

    class RayLikeEnvironment(LightningEnvironment):
        pass

    RayLikeEnvironment.__module__ = "ray.train.lightning._lightning_utils"
    assert engine_reads_each_save(RayLikeEnvironment())
    assert not engine_reads_each_save(LightningEnvironment())
    assert not engine_reads_each_save(None)

    class Strategy(WritesCheckpointsInBackground):
        def __init__(self, environment):
            self.cluster_environment = environment
            self.lightning_module = SimpleNamespace(
                _trainer=SimpleNamespace(state=SimpleNamespace(status=TrainerStatus.RUNNING))
            )
            self.waits = 0

        def wait_for_checkpoint_writes(self):
            self.waits += 1

    for environment, waits in ((RayLikeEnvironment(), 1), (LightningEnvironment(), 0), (None, 0)):
        strategy = Strategy(environment)
        strategy._wait_unless_a_loop_runs()
        assert strategy.waits == waits, type(environment).__name__

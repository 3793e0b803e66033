"""Fits on PJRT CPU in each XLA precision: real dtypes, and XLA_USE_* scoped to the run."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.xla

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

VARIABLES = ("XLA_USE_F16", "XLA_USE_BF16")


class Recorder(L.LightningModule):
    """Records, at each training step, dtypes and device as the running model sees them."""

    def __init__(self, fail_at_step: int | None = None) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 2)
        self.fail_at_step = fail_at_step
        self.seen: list[dict[str, object]] = []

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at_step:
            raise RuntimeError("failure injected by the test")
        x, y = batch
        out = self.layer(x)
        self.seen.append(
            {
                "parameter": (self.layer.weight.dtype, self.layer.weight.device.type),
                "input": x.dtype,
                "activation": out.dtype,
                "variables": {name: os.environ.get(name) for name in VARIABLES},
            }
        )
        return nn.functional.cross_entropy(out.float(), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(32, 8, generator=generator), torch.randint(0, 2, (32,), generator=generator)),
        batch_size=8,
    )


def fit(precision: str, model: Recorder) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="xla",
        devices=1,
        precision=precision,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader())
    return trainer


@pytest.mark.parametrize(
    ("precision", "dtype", "variable"),
    [
        ("32-true", torch.float32, None),
        ("16-true", torch.float16, "XLA_USE_F16"),
        ("bf16-true", torch.bfloat16, "XLA_USE_BF16"),
    ],
)
def test_fit_runs_in_the_requested_dtype_with_the_variable_set_only_during_fit(precision, dtype, variable):
    model = Recorder()
    trainer = fit(precision, model)

    assert type(trainer.precision_plugin).__module__ == "xla_plugins.precision"
    assert len(model.seen) == 3
    expected_variables = {name: ("1" if name == variable else None) for name in VARIABLES}
    for step in model.seen:
        assert step == {
            "parameter": (dtype, "xla"),
            "input": dtype,
            "activation": dtype,
            "variables": expected_variables,
        }
    assert not {name for name in VARIABLES if name in os.environ}


@pytest.mark.parametrize("precision", ["16-true", "bf16-true"])
def test_the_variable_is_removed_after_a_fit_that_raises(precision):
    model = Recorder(fail_at_step=1)
    with pytest.raises(RuntimeError, match="failure injected"):
        fit(precision, model)
    assert len(model.seen) == 1 and any(model.seen[0]["variables"].values())
    assert not {name for name in VARIABLES if name in os.environ}


def test_no_variable_is_set_by_building_the_precision_plugin():
    from xla_plugins import XLAPrecision

    XLAPrecision("bf16-true")
    assert not {name for name in VARIABLES if name in os.environ}


def test_replica_threads_share_the_default_dtype_without_clobbering_each_other():
    import threading

    from xla_plugins import XLAPrecision

    precision = XLAPrecision("bf16-true")
    inside, entered, release = [], threading.Barrier(2), threading.Event()

    def replica(first_out: bool) -> None:
        with precision.forward_context():
            entered.wait()
            inside.append(torch.get_default_dtype())
            if not first_out:
                release.wait()
        if first_out:
            inside.append(torch.get_default_dtype())  # the other replica is still in its forward
            release.set()

    threads = [threading.Thread(target=replica, args=(first,)) for first in (True, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert inside == [torch.bfloat16] * 3
    assert torch.get_default_dtype() == torch.float32

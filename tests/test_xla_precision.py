"""Fits on PJRT CPU in each XLA precision: real dtypes; no XLA_USE_* variable set, a user's own left as found."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.xla

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")
from conftest import run_python  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

VARIABLES = ("XLA_USE_F16", "XLA_USE_BF16", "XLA_DOWNCAST_BF16")


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
    ("precision", "dtype"), [("32-true", torch.float32), ("16-true", torch.float16), ("bf16-true", torch.bfloat16)]
)
def test_fit_runs_in_the_requested_dtype_without_setting_a_precision_variable(precision, dtype):
    """torch_xla >= 2.6 deprecates XLA_USE_BF16 and never reads XLA_USE_F16: the dtype conversion does the work."""
    model = Recorder()
    trainer = fit(precision, model)

    assert type(trainer.precision_plugin).__module__ == "xla_plugins.roles.precision"
    assert len(model.seen) == 3
    for step in model.seen:
        assert step == {
            "parameter": (dtype, "xla"),
            "input": dtype,
            "activation": dtype,
            "variables": {name: None for name in VARIABLES},
        }


@pytest.mark.subprocess  # a fresh interpreter: not in the cells that change one version (tox.ini)
def test_a_pallas_kernel_module_imported_during_a_bf16_run_sees_no_xla_use_bf16():
    """torch_xla's Pallas kernels raise "Pallas kernel does not support XLA_USE_BF16" when it was set at import."""
    result = run_python(
        """
        import os, subprocess, sys
        import lightning as L, torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        class ImportsAKernel(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 2)

            def training_step(self, batch, batch_idx):
                import torch_xla.experimental.custom_kernel as kernels  # flash attention's module
                child = subprocess.run(
                    [sys.executable, "-c", "import os; print(os.environ.get('XLA_USE_BF16'))"],
                    capture_output=True, text=True,
                )
                print("kernel flag:", kernels._XLA_USE_BF16, "child:", child.stdout.strip(), self.layer.weight.dtype)
                return self.layer(batch[0]).float().sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        trainer = L.Trainer(accelerator="xla", devices=1, precision="bf16-true", max_steps=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(ImportsAKernel(), DataLoader(TensorDataset(torch.randn(4, 4)), batch_size=4))
        """,
        env={name: None for name in VARIABLES},
    )
    assert "kernel flag: False child: None torch.bfloat16" in result.stdout


@pytest.mark.slow  # a fresh interpreter: primary tox cell only (tox.ini)
def test_a_users_own_precision_variables_are_left_as_found_with_one_warning_each():
    """A user's XLA_USE_BF16 / XLA_DOWNCAST_BF16 change a '32-true' run's math: warned once, never deleted."""
    result = run_python(
        """
        import os, warnings
        import lightning as L, torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        class Model(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 2)

            def training_step(self, batch, batch_idx):
                return self.layer(batch[0]).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):  # two runs, one warning per variable
                trainer = L.Trainer(accelerator="xla", devices=1, precision="32-true", max_steps=1, logger=False,
                                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
                trainer.fit(Model(), DataLoader(TensorDataset(torch.randn(4, 4)), batch_size=4))
        for warning in caught:
            if "torch_xla then computes float32 tensors in bfloat16" in str(warning.message):
                print("warned:", str(warning.message).split(":")[0])
        print("after:", os.environ.get("XLA_USE_BF16"), os.environ.get("XLA_DOWNCAST_BF16"))
        """,
        env={"XLA_USE_BF16": "1", "XLA_DOWNCAST_BF16": "1"},
    )
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("warned:")] == [
        "warned: The environment sets XLA_USE_BF16=1",
        "warned: The environment sets XLA_DOWNCAST_BF16=1",
    ]
    assert "after: 1 1" in lines


def test_a_failed_fit_leaves_the_environment_as_found():
    model = Recorder(fail_at_step=1)
    with pytest.raises(RuntimeError, match="failure injected"):
        fit("bf16-true", model)
    assert len(model.seen) == 1 and not any(model.seen[0]["variables"].values())


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

"""Distributed-sampler injection errors that name the batch sampler and the way out."""

from __future__ import annotations

import pytest

L = pytest.importorskip("lightning")
import torch  # noqa: E402
from test_is_distributed import CountingModel, SaysDistributed  # noqa: E402
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset  # noqa: E402


class FixedBatches(BatchSampler):
    """A custom batch sampler whose constructor cannot take a sampler: it cannot be rebuilt."""

    def __init__(self, length: int) -> None:
        super().__init__(SequentialSampler(range(length)), batch_size=2, drop_last=False)


def test_a_batch_sampler_that_cannot_be_rebuilt_gets_an_error_naming_it_and_the_switch():
    loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.arange(8)), batch_sampler=FixedBatches(8))
    trainer = L.Trainer(
        accelerator="cpu",
        strategy=SaysDistributed(),
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    with pytest.raises(
        TypeError, match="Cannot inject a DistributedSampler into the custom batch sampler FixedBatches"
    ) as info:
        trainer.fit(CountingModel(), loader)
    assert "Trainer(use_distributed_sampler=False)" in str(info.value)


def test_switching_injection_off_lets_the_batch_sampler_run_as_given():
    model = CountingModel()
    loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.arange(8)), batch_sampler=FixedBatches(8))
    trainer = L.Trainer(
        accelerator="cpu",
        strategy=SaysDistributed(),
        use_distributed_sampler=False,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, loader)
    assert model.indices == list(range(8))

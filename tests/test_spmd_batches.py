"""Global batches on the SPMD strategies: every batch structure joined, none cut to one device's share.

Issue: a dataclass batch (or a user batch class) was taken from the first of the N per-device batches,
so `xla_spmd` / `xla_fsdp_v2` trained each step on one device's share and an epoch saw a quarter of
the data on 4 devices, without a word; with `drop_last=True` the epoch still ended on a partial
global batch. The end-to-end cases count the samples of each step and of the epoch on 4 PJRT CPU
devices, in a fresh interpreter each.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import run_python
from torch.utils.data import DataLoader

from xla_plugins.strategies._batches import GlobalBatches, concatenate

pytestmark = pytest.mark.xla


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    idx: torch.Tensor
    names: list
    source: str = "train"
    rows: int = dataclasses.field(default=0, init=False)


@dataclasses.dataclass(frozen=True)
class FrozenBatch:
    x: torch.Tensor


class OwnBatch:
    """A user batch class with its own transfer (`.to()`), which Lightning moves but cannot look into."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def to(self, *args, **kwargs):
        return OwnBatch(self.x.to(*args, **kwargs))


def test_dataclass_batches_are_joined_field_by_field_into_a_new_instance():
    batches = [
        Batch(torch.full((2, 3), float(i)), torch.tensor([2 * i, 2 * i + 1]), [f"a{i}", f"b{i}"]) for i in range(3)
    ]
    for batch in batches:
        batch.rows = 2
    joined = concatenate(batches)
    assert type(joined) is Batch and joined is not batches[0]
    assert joined.x.shape == (6, 3) and joined.idx.tolist() == [0, 1, 2, 3, 4, 5]
    assert joined.names == ["a0", "b0", "a1", "b1", "a2", "b2"] and joined.source == "train" and joined.rows == 2
    assert batches[0].x.shape == (2, 3)  # the loader's batch is left as it was
    frozen = concatenate([FrozenBatch(torch.zeros(1)), FrozenBatch(torch.ones(1))])
    assert frozen.x.tolist() == [0.0, 1.0]
    nested = concatenate([{"inputs": [Batch(torch.zeros(1, 1), torch.tensor([i]), ["n"])]} for i in range(2)])
    assert nested["inputs"][0].idx.tolist() == [0, 1]


def test_a_batch_that_cannot_be_joined_is_refused_with_the_type_and_the_ways_out():
    with pytest.raises(
        TypeError, match=r"A batch of type OwnBatch cannot be joined .*dataclasses only.*batch='global'"
    ):
        concatenate([OwnBatch(torch.zeros(2)), OwnBatch(torch.ones(2))])
    # batch-wide values: kept when every device's batch has the same one, refused when they differ
    assert concatenate([{"x": torch.zeros(1), "step": 3}, {"x": torch.ones(1), "step": 3}])["step"] == 3
    assert concatenate([torch.tensor(7.0), torch.tensor(7.0)]).item() == 7.0
    with pytest.raises(TypeError, match=r"different values of one batch-wide field \(1, 2\).*batch='global'"):
        concatenate([{"x": torch.zeros(1), "step": 1}, {"x": torch.ones(1), "step": 2}])
    with pytest.raises(TypeError, match=r"\(0\.5, 1\.5\)"):
        concatenate([torch.tensor(0.5), torch.tensor(1.5)])


def test_per_device_batches_of_different_lengths_are_refused_with_the_shapes_and_the_ways_out():
    # what a collate function padding each device's batch to its own longest sequence gives
    with pytest.raises(TypeError, match=r"different shapes \(1x5, 1x7\).*fixed max_length.*batch='global'"):
        concatenate([torch.zeros(1, 5), torch.zeros(1, 7)])
    with pytest.raises(TypeError, match=r"different shapes \(2x3, list\)"):
        concatenate([{"x": torch.zeros(2, 3)}, {"x": [1, 2]}])
    assert concatenate([torch.zeros(1, 5), torch.ones(2, 5)]).shape == (3, 5)  # the first dimension may differ


@pytest.mark.parametrize("drop_last", [False, True])
def test_global_batches_follow_the_loaders_drop_last(drop_last):
    loader = DataLoader(range(70), batch_size=4, drop_last=drop_last)  # 17 full batches, and 2 left over
    grouped = GlobalBatches(loader, per_step=4)
    sizes = [len(batch) for batch in grouped]
    # drop_last=True: only full global batches (4 x 4), as each device's loader drops its partial batch on DDP
    assert sizes == ([16] * 4 if drop_last else [16, 16, 16, 16, 6])
    assert len(grouped) == len(sizes)


SCRIPT = """
import dataclasses, json, torch, lightning as L
from torch.utils.data import DataLoader, Dataset

@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    idx: torch.Tensor

class OwnBatch:
    def __init__(self, x, idx):
        self.x, self.idx = x, idx
    def to(self, *args, **kwargs):
        return OwnBatch(self.x.to(*args, **kwargs), self.idx.to(*args, **kwargs))

class Samples(Dataset):
    def __len__(self):
        return 70
    def __getitem__(self, i):
        return torch.full((3,), float(i)), i

def collate(kind):
    def join(items):
        x, idx = torch.stack([x for x, _ in items]), torch.tensor([i for _, i in items])
        return Batch(x, idx) if kind == "dataclass" else OwnBatch(x, idx)
    return join

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.seen = []
    def training_step(self, batch, batch_idx):
        self.seen.append(batch.idx.cpu().tolist())  # a host read, for the test's count only
        return self.layer(batch.x).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

def fit(kind, drop_last):
    model = Model()
    loader = DataLoader(Samples(), batch_size=4, drop_last=drop_last, collate_fn=collate(kind))
    trainer = L.Trainer(accelerator="tpu", devices=4, strategy=STRATEGY, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    try:
        trainer.fit(model, loader)
    except TypeError as error:
        return str(error)
    return model.seen

print(json.dumps({"dataclass": fit("dataclass", False), "dataclass_drop_last": fit("dataclass", True),
                  "own": fit("own", False)}))
"""


@pytest.mark.slow  # several devices: primary tox cell only (tox.ini)
@pytest.mark.parametrize("strategy", ["xla_spmd", "xla_fsdp_v2"])
def test_dataclass_batches_train_on_the_global_batch_and_the_epoch_sees_every_sample(strategy):
    result = run_python(
        f"STRATEGY = {strategy!r}\n" + SCRIPT, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}, timeout=600
    )
    runs = json.loads(result.stdout.splitlines()[-1])
    # 70 samples, per-device batch 4 on 4 devices: four global batches of 16, then the 6 left over
    assert [len(step) for step in runs["dataclass"]] == [16, 16, 16, 16, 6]
    assert sorted(i for step in runs["dataclass"] for i in step) == list(range(70))
    # drop_last=True: four full global batches, no partial one (64 samples)
    assert [len(step) for step in runs["dataclass_drop_last"]] == [16, 16, 16, 16]
    assert sorted(i for step in runs["dataclass_drop_last"] for i in step) == list(range(64))
    assert runs["own"].startswith("A batch of type OwnBatch cannot be joined")

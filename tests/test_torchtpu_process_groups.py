"""The "tpu_dist" group beside a launcher's default group without a "tpu" backend (strategies._process_groups).

In this process, on one rank: a default group made before any strategy (as Ray Train makes its gloo group)
gets a second group on "tpu_dist" that reduces "tpu" tensors, and that group is destroyed by torch's own call.
tests/test_torchtpu_ray.py checks the same under Ray Train with two workers.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from torchtpu_plugins.strategies import _process_groups

pytestmark = pytest.mark.torchtpu


@pytest.fixture
def world():  # type: ignore[no-untyped-def]
    """Start the default group with the backend given by the test (one rank, a store in memory); destroy it after."""

    def start(backend: str) -> None:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


def test_which_launcher_groups_reduce_tpu_tensors():
    """torch's BackendConfig: the stand-in registers "tpu_dist" for "tpu" (as torch_tpu does)."""
    assert not _process_groups.reduces_tpu_tensors("gloo")  # Ray Train's group on workers without a TPU resource
    assert _process_groups.reduces_tpu_tensors("tpu_dist")  # Ray Train's group on TPU workers (Ray >= 2.58)
    assert _process_groups.reduces_tpu_tensors("cpu:gloo,tpu:tpu_dist")  # TorchTPU's composite group


def test_a_gloo_world_gets_a_tpu_dist_group_that_reduces_tpu_tensors_and_is_destroyed(world):
    world("gloo")
    tensor = torch.full((2,), 3.0, device="tpu")
    with pytest.raises(RuntimeError, match="No backend type associated with device type tpu"):
        dist.all_reduce(tensor)  # what DDP would meet over the launcher's group
    group = _process_groups.tpu_group()
    assert (dist.get_backend(group), dist.get_world_size(group), dist.get_rank(group)) == ("tpu_dist", 1, 0)
    dist.all_reduce(tensor, group=group)
    assert (tensor.device.type, tensor.tolist()) == ("tpu", [3.0, 3.0])
    # the stand-in's group keeps the name torch gave it, so torch's destroy_process_group(group) completes
    _process_groups.destroy(group)
    assert group not in dist.distributed_c10d._world.pg_map
    assert dist.get_backend() == "gloo"  # the launcher's group stays


def test_a_tpu_dist_world_needs_no_second_group(world):
    world("tpu_dist")
    assert _process_groups.tpu_group() is None

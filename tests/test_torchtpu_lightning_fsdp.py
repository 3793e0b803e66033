"""strategy="fsdp" on accelerator="tpu" (stand-in, two devices): Lightning's FSDP2 path equals the same on CPU gloo.

tests/scripts/torchtpu_lightning_fsdp.py runs one Lightning script through Lightning's own launcher: on "tpu"
with strategy="fsdp" by name (a module that does not shard itself), and on "cpu" with Lightning's own
ModelParallelStrategy over gloo (the module shards each child layer with fully_shard itself, on a data-parallel
mesh of both processes); the same for a Fabric loop. Every address is on the loopback.
"""

from __future__ import annotations

import os

import pytest
import torch
from test_torchtpu_lightning_ddp import run_two_processes

pytestmark = pytest.mark.torchtpu
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "torchtpu_lightning_fsdp.py")


def _run(api: str, accelerator: str, tmp_path) -> dict:  # type: ignore[no-untyped-def]
    return run_two_processes(SCRIPT, api, accelerator, output=str(tmp_path / f"{api}-{accelerator}.pt"))


@pytest.mark.parametrize(
    ("api", "strategy"), [("trainer", "TorchTPUFSDPStrategy"), ("fabric", "FabricTorchTPUFSDPStrategy")]
)
def test_two_process_fsdp_by_lightnings_name_on_tpu_equals_fsdp2_on_cpu_gloo(api, strategy, tmp_path):
    tpu, cpu = _run(api, "tpu", tmp_path), _run(api, "cpu", tmp_path)
    assert (tpu["strategy"], tpu["backend"], tpu["world_size"]) == (strategy, "tpu_dist", 2)
    assert (cpu["strategy"], cpu["backend"]) == ("ModelParallelStrategy", "gloo")
    assert tpu["sharded"] and cpu["sharded"]  # every parameter a DTensor during the fit
    assert tpu["devices"] == {"tpu"}
    assert len(tpu["losses"]) == 4
    assert tpu["losses"] == cpu["losses"]
    assert tpu["state"].keys() == cpu["state"].keys() == {"hidden.weight", "hidden.bias", "out.weight", "out.bias"}
    for name, value in cpu["state"].items():
        assert torch.equal(tpu["state"][name], value), name

"""strategy="fsdp" on accelerator="tpu" (stand-in, two devices): Lightning's FSDP2 path equals the same on CPU gloo.

tests/scripts/torchtpu_lightning_fsdp.py runs one Lightning script through Lightning's own launcher: on "tpu"
with strategy="fsdp" by name (a module that shards itself in configure_model, as Lightning asks, or one that does
not), and on "cpu" with Lightning's own ModelParallelStrategy over gloo (the module shards each child layer with
fully_shard itself, on a data-parallel mesh of both processes); the same for a Fabric loop. Every address is on
the loopback.
"""

from __future__ import annotations

import os

import pytest
import torch
from test_torchtpu_lightning_ddp import run_two_processes

pytestmark = pytest.mark.torchtpu
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "torchtpu_lightning_fsdp.py")


def _run(api: str, accelerator: str, module: str, tmp_path) -> dict:  # type: ignore[no-untyped-def]
    output = str(tmp_path / f"{api}-{accelerator}-{module}.pt")
    return run_two_processes(SCRIPT, api, accelerator, module, output=output)


@pytest.fixture(scope="module")
def on_cpu(tmp_path_factory) -> dict:  # type: ignore[no-untyped-def]
    """The reference runs (Lightning's ModelParallelStrategy over gloo), by api, each made once."""
    runs: dict = {}

    def run(api: str) -> dict:
        if api not in runs:
            runs[api] = _run(api, "cpu", "self-sharding", tmp_path_factory.mktemp(api))
        return runs[api]

    return run  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("api", "module", "strategy"),
    [
        ("trainer", "plain", "TorchTPUFSDPStrategy"),
        ("trainer", "self-sharding", "TorchTPUFSDPStrategy"),
        ("fabric", "plain", "FabricTorchTPUFSDPStrategy"),
    ],
)
def test_two_process_fsdp_by_lightnings_name_on_tpu_equals_fsdp2_on_cpu_gloo(api, module, strategy, on_cpu, tmp_path):
    tpu, cpu = _run(api, "tpu", module, tmp_path), on_cpu(api)
    assert (tpu["strategy"], tpu["backend"], tpu["world_size"]) == (strategy, "tpu_dist", 2)
    assert (cpu["strategy"], cpu["backend"]) == ("ModelParallelStrategy", "gloo")
    assert tpu["sharded"] and cpu["sharded"]  # every parameter a DTensor during the fit
    assert tpu["devices"] == {"tpu"}
    assert len(tpu["losses"]) == 4
    assert tpu["losses"] == cpu["losses"]
    assert tpu["state"].keys() == cpu["state"].keys() == {"hidden.weight", "hidden.bias", "out.weight", "out.bias"}
    for name, value in cpu["state"].items():
        assert torch.equal(tpu["state"][name], value), name

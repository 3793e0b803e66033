"""The XLA strategies in processes torchrun started: torch_xla's own torchrun support, no spawn.

On PJRT CPU several processes never form one XLA world (docs/testing.md), so what a TPU would report
is simulated where a test needs a joined world (``xla_plugins.testing.simulated_runtime``, tests named
``..._simulated_tpu``): the runtime's process and device figures only. torch_xla's ``xla://``
rendezvous, its process group, devices and graphs stay real. The in-process tests set torchrun's
variables with ``monkeypatch``; the one ``slow`` test runs ``torchrun --nproc_per_node=2`` on
127.0.0.1 under a timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

L = pytest.importorskip("lightning")
from lightning.fabric.plugins.environments import TorchElasticEnvironment  # noqa: E402

import trainer_plugins  # noqa: E402

pytestmark = pytest.mark.xla

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "xla_torchrun.py")


def _torchrun_variables(monkeypatch, *, rank, world_size, local_world_size, group_rank=0):
    """Set what torchrun sets in a process it started (TorchElasticEnvironment.detect() reads TORCHELASTIC_RUN_ID)."""
    local_rank = rank % local_world_size
    variables = {
        "TORCHELASTIC_RUN_ID": "test",
        "RANK": rank,
        "WORLD_SIZE": world_size,
        "LOCAL_RANK": local_rank,
        "LOCAL_WORLD_SIZE": local_world_size,
        "GROUP_RANK": group_rank,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": 29400,
    }
    for name, value in variables.items():
        monkeypatch.setenv(name, str(value))


def _host_figures(host: int, hosts: int, devices: int):
    from xla_plugins.runtime._world import RuntimeFigures

    return RuntimeFigures(hosts, host, 1, hosts * devices, devices)


def test_xla_under_torchrun_takes_torchrun_environment_devices_and_no_spawning_launcher(monkeypatch):
    from xla_plugins.strategies.launchers import FabricXLALauncher, XLALauncher

    _torchrun_variables(monkeypatch, rank=1, world_size=4, local_world_size=2, group_rank=0)
    explanation = trainer_plugins.explain(accelerator="xla", devices="auto", strategy="xla")
    (decision,) = [d for d in explanation if d.role == "environment"]
    assert decision.choice.startswith("torchelastic (") and "xla-plugins" in decision.plugin
    trainer = L.Trainer(accelerator="xla", devices="auto", strategy="xla", logger=False)
    fabric = L.Fabric(accelerator="xla", devices="auto", strategy="xla")
    for strategy in (trainer.strategy, fabric.strategy):
        assert isinstance(strategy.cluster_environment, TorchElasticEnvironment)
        assert len(strategy.parallel_devices) == 2  # devices="auto": torchrun's processes on this host
        assert not isinstance(strategy.launcher, (XLALauncher, FabricXLALauncher))
        strategy._launched = True  # as after setup_environment
        assert (strategy.world_size, strategy.global_rank, strategy.local_rank, strategy.node_rank) == (4, 1, 1, 0)
        assert strategy.distributed_sampler_kwargs == {"num_replicas": 4, "rank": 1}
    assert fabric.strategy.launcher is None  # fabric.launch() runs the function here


def test_xla_spmd_under_torchrun_is_one_rank_per_host_simulated_tpu(monkeypatch):
    from xla_plugins.roles.environment import check_launcher_world
    from xla_plugins.runtime._world import one_process_per_host
    from xla_plugins.testing import simulated_runtime

    _torchrun_variables(monkeypatch, rank=1, world_size=2, local_world_size=1, group_rank=1)
    with simulated_runtime(lambda: _host_figures(1, 2, 4)):
        trainer = L.Trainer(accelerator="xla", devices="auto", strategy="xla_spmd", logger=False)
        strategy = trainer.strategy
        assert isinstance(strategy.cluster_environment, TorchElasticEnvironment)
        assert len(strategy.parallel_devices) == 4  # one process drives every device of its host
        assert (strategy.world_size, strategy.global_rank, strategy.local_rank, strategy.node_rank) == (2, 1, 0, 1)
        assert strategy.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 1}
        check_launcher_world(one_process_per_host, "host")  # torchrun's world is the runtime's hosts
        monkeypatch.setenv("RANK", "0")  # torchrun numbered this host otherwise than the runtime
        with pytest.raises(RuntimeError, match=r"WORLD_SIZE=2 and RANK=0.*world of 2 \(one rank per host\).*rank 1"):
            check_launcher_world(one_process_per_host, "host")


def test_xla_spmd_under_torchrun_refuses_several_processes_per_host(monkeypatch):
    _torchrun_variables(monkeypatch, rank=0, world_size=2, local_world_size=2)
    with pytest.raises(ValueError, match=r"LOCAL_WORLD_SIZE=2 on this host.*--nproc_per_node=1"):
        L.Trainer(accelerator="xla", devices="auto", strategy="xla_spmd", logger=False)


def test_a_bad_local_world_size_is_refused_naming_it(monkeypatch):
    _torchrun_variables(monkeypatch, rank=0, world_size=2, local_world_size=2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ValueError, match=r"LOCAL_WORLD_SIZE='two' is not a process count"):
        L.Trainer(accelerator="xla", devices="auto", strategy="xla", logger=False)


def _free_port() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.mark.slow  # torchrun with two fresh interpreters, each Trainer fits and a Fabric loop: about 30-50 s
def test_xla_under_torchrun_x2_starts_nothing_and_joins_torch_xla_world_simulated_tpu(tmp_path):
    out = str(tmp_path / "rank")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}", SCRIPT, out,
    ]  # fmt: skip
    env = dict(os.environ, PJRT_DEVICE="CPU", GLOO_SOCKET_IFNAME="lo")
    env.pop("CPU_NUM_DEVICES", None)  # one PJRT CPU device per process, as one chip per process on TPU
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.load(open(f"{out}.{rank}.json")) for rank in range(2)]
    for rank, record in enumerate(ranks):
        assert record["spawns"] == 0  # neither launcher spawned: torchrun's processes are the replicas
        # torch_xla's torchrun support, called for real: the xla:// rendezvous configures this process
        assert record["init_process_group"] == [["xla", "xla://"]]
        assert record["initialize_multiprocess"] == [[rank, 2]]  # (LOCAL_RANK, LOCAL_WORLD_SIZE)
        # PJRT CPU: each process is an XLA world of its own, which the strategy refuses, naming both worlds
        assert f"WORLD_SIZE=2 and RANK={rank}, but torch_xla's runtime formed no such world" in record["cpu"]["error"]
        for api in ("trainer", "fabric"):
            view = record[api]
            assert view["environment"] == "TorchElasticEnvironment"
            assert view["world"] == [2, rank, rank, 0]  # world size, global, local and node rank: torchrun's
        assert record["trainer"]["launcher"] == "InProcessLauncher" and record["fabric"]["launcher"] is None
        assert record["trainer"]["devices"] == 2 and record["trainer"]["backend"] == "xla"
        assert "LOCAL_WORLD_SIZE=2 on this host" in record["spmd"]["error"]
    for api in ("trainer", "fabric"):  # the injected samplers' shards are disjoint and cover the data
        shards = [set(record[api]["seen"]) for record in ranks]
        assert not shards[0] & shards[1] and shards[0] | shards[1] == set(range(8))

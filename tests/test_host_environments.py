"""Host environments: TPU VM, Indexed Job, multislice and SkyPilot variables give each host its place.

In-process and cheap: the variables are set with ``monkeypatch`` (left as they were after each test),
the connector is built without a fit, and nothing waits for another host.
"""

from __future__ import annotations

import os

import pytest

L = pytest.importorskip("lightning")
from lightning.fabric.plugins.environments import LightningEnvironment, TorchElasticEnvironment  # noqa: E402

import trainer_plugins  # noqa: E402
from trainer_plugins import environments  # noqa: E402
from trainer_plugins.environments import (  # noqa: E402
    DEFAULT_MAIN_PORT,
    IndexedJobEnvironment,
    SkyPilotEnvironment,
    TPUVMEnvironment,
    read_indexed_job,
)

#: Every variable a host environment or Lightning's launcher detection reads; each test starts without them.
VARIABLES = (
    *environments.TPU_VM_VARIABLES,
    *environments.MULTISLICE_VARIABLES,
    *environments.INDEXED_JOB_VARIABLES,
    *environments.SKYPILOT_VARIABLES,
    *environments.LIGHTNING_VARIABLES,
    *environments.KUBEFLOW_VARIABLES,
    "MASTER_PORT",
    "HOSTNAME",  # an Indexed Job's pod name: the machine's own must not decide a test
    "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "SLURM_NTASKS",
    "SLURM_JOB_NAME",
    "LSB_JOBID",
    "LSB_DJOB_RANKFILE",
    "LSB_HOSTS",
    "JSM_NAMESPACE_SIZE",
)

GKE = {"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "host-0,host-1,host-2"}
MULTISLICE = {
    "TPU_WORKER_ID": "1",
    "TPU_WORKER_HOSTNAMES": "s1-0,s1-1",
    "MEGASCALE_NUM_SLICES": "2",
    "MEGASCALE_SLICE_ID": "1",
    "MEGASCALE_COORDINATOR_ADDRESS": "s0-0.job:8080",
}
SKYPILOT = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n", "SKYPILOT_NUM_NODES": "2"}
TORCHRUN = {
    "RANK": "0",
    "GROUP_RANK": "0",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "1",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "run",
}


@pytest.fixture
def host(monkeypatch):
    """Set the given variables on a clean slate; monkeypatch restores every one after the test."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_variables(variables):
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return set_variables


def environment_of(**flags):
    flags = {"accelerator": "cpu", "devices": 1, "num_nodes": 2, **flags}
    return trainer_plugins.TrainerConnector(**flags).cluster_environment


def test_gke_variables_give_the_worker_id_as_node_rank_and_the_first_host_as_main_address(host):
    host(GKE)
    environment = TPUVMEnvironment()
    assert environment.node_rank() == 1
    assert environment.layout.num_nodes == 3
    assert environment.main_address == "host-0"
    assert environment.main_port == DEFAULT_MAIN_PORT == 29500
    assert environment.slice_id == 0
    assert environment.local_rank() == 0
    assert environment.creates_processes_externally is False  # Lightning's launcher starts the local processes


def test_master_port_sets_the_port(host):
    host({**GKE, "MASTER_PORT": "1234"})
    assert TPUVMEnvironment().main_port == 1234


def test_the_strategy_sets_world_size_and_global_rank_as_on_lightnings_environment(host):
    host(GKE)
    environment = TPUVMEnvironment()
    environment.set_world_size(6)
    environment.set_global_rank(3)
    assert (environment.world_size(), environment.global_rank()) == (6, 3)


def test_multislice_numbers_the_hosts_slice_by_slice(host):
    host(MULTISLICE)
    environment = TPUVMEnvironment()
    assert environment.node_rank() == 1 * 2 + 1
    assert environment.layout.num_nodes == 4
    assert environment.main_address == "s0-0.job"  # Megascale's own port dropped
    assert environment.slice_id == 1


def test_multislice_of_one_host_slices_takes_the_slice_as_node_rank(host):
    host({key: MULTISLICE[key] for key in environments.MULTISLICE_VARIABLES})
    environment = TPUVMEnvironment()
    assert (environment.node_rank(), environment.layout.num_nodes, environment.main_address) == (1, 2, "s0-0.job")


def test_an_indexed_job_with_master_addr(host):
    host({"JOB_COMPLETION_INDEX": "3", "MASTER_ADDR": "trainer-0.workers"})
    environment = IndexedJobEnvironment()
    assert (environment.node_rank(), environment.main_address) == (3, "trainer-0.workers")
    assert environment.layout.num_nodes is None  # Kubernetes does not say: the Trainer's num_nodes counts


def test_an_indexed_job_under_a_headless_service_finds_pod_0():
    variables = {"JOB_COMPLETION_INDEX": "2", "HOSTNAME": "train-job-2"}
    domains = {"train-job-2": "workers.default.svc.cluster.local"}
    layout = read_indexed_job(variables, domain_of=domains.get)
    assert (layout.node_rank, layout.main_address) == (2, "train-job-0.workers.default.svc.cluster.local")


def test_skypilot_variables(host):
    host(SKYPILOT)
    environment = SkyPilotEnvironment()
    assert (environment.node_rank(), environment.layout.num_nodes, environment.main_address) == (1, 2, "10.0.0.5")


BAD = {
    "worker id out of range": (
        {"TPU_WORKER_ID": "2", "TPU_WORKER_HOSTNAMES": "a,b"},
        ["TPU_WORKER_ID='2'", "TPU_WORKER_HOSTNAMES='a,b'"],
    ),
    "worker id without host names": ({"TPU_WORKER_ID": "1"}, ["TPU_WORKER_ID='1'", "TPU_WORKER_HOSTNAMES"]),
    "host names without worker id": ({"TPU_WORKER_HOSTNAMES": "a,b"}, ["TPU_WORKER_HOSTNAMES='a,b'", "TPU_WORKER_ID"]),
    "worker id not a number": ({"TPU_WORKER_ID": "one", "TPU_WORKER_HOSTNAMES": "a,b"}, ["TPU_WORKER_ID='one'"]),
    "slice id out of range": (
        {**MULTISLICE, "MEGASCALE_SLICE_ID": "2"},
        ["MEGASCALE_SLICE_ID='2'", "MEGASCALE_NUM_SLICES='2'"],
    ),
    "slices without coordinator": (
        {"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "0"},
        ["MEGASCALE_NUM_SLICES='2'", "MEGASCALE_COORDINATOR_ADDRESS"],
    ),
    "skypilot rank without addresses": (
        {"SKYPILOT_NODE_RANK": "1"},
        ["SKYPILOT_NODE_RANK='1'", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES"],
    ),
    "skypilot rank out of range": (
        {**SKYPILOT, "SKYPILOT_NODE_RANK": "2"},
        ["SKYPILOT_NODE_RANK='2'", "SKYPILOT_NUM_NODES='2'"],
    ),
    "skypilot count contradicts the addresses": (
        {**SKYPILOT, "SKYPILOT_NUM_NODES": "3"},
        ["SKYPILOT_NUM_NODES='3'", "2 address(es)"],
    ),
    "indexed job without main address": (
        {"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "laptop"},
        ["JOB_COMPLETION_INDEX='1'", "HOSTNAME='laptop'", "MASTER_ADDR"],
    ),
    "gke and indexed job disagree": (
        {**GKE, "JOB_COMPLETION_INDEX": "0", "MASTER_ADDR": "host-0"},
        ["TPU_WORKER_ID='1'", "JOB_COMPLETION_INDEX='0'"],
    ),
    "gke and skypilot disagree": (
        {**GKE, **SKYPILOT, "SKYPILOT_NODE_RANK": "0"},
        ["TPU_WORKER_ID='1'", "SKYPILOT_NODE_RANK='0'"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_partial_or_contradictory_variables_raise_naming_them(host, case):
    variables, named = BAD[case]
    host(variables)
    with pytest.raises(ValueError) as info:
        environment_of()  # never a silent node 0
    for text in named:
        assert text in str(info.value)


def test_agreeing_gke_and_indexed_job_variables_give_the_tpu_vm_environment(host):
    host({**GKE, "JOB_COMPLETION_INDEX": "1"})  # GKE sets both on a TPU slice's pods
    environment = environment_of(num_nodes=3)
    assert type(environment) is TPUVMEnvironment and environment.node_rank() == 1


def test_without_host_variables_lightning_decides_as_before(host):
    assert type(environment_of()) is LightningEnvironment


def test_torchrun_variables_win_over_the_hosts(host):
    host({**GKE, **TORCHRUN})
    assert type(environment_of()) is TorchElasticEnvironment


def test_lightnings_node_rank_wins_over_the_hosts(host):
    host({**GKE, "NODE_RANK": "0"})  # set by Lightning's launcher in the processes it starts, or by the user
    assert type(environment_of()) is LightningEnvironment


def test_an_environment_given_by_the_user_wins(host):
    host(GKE)
    given = LightningEnvironment()
    assert environment_of(plugins=[given]) is given


def test_explain_names_the_environment_and_the_variables_read(host):
    host({**MULTISLICE, "MASTER_PORT": "1234"})
    explanation = trainer_plugins.explain(accelerator="cpu", devices=1, num_nodes=4)
    (decision,) = [d for d in explanation if d.role == "environment"]
    assert decision.choice == "tpu_vm (trainer_plugins.environments.TPUVMEnvironment)"
    for text in ("TPU_WORKER_ID='1'", "MEGASCALE_SLICE_ID='1'", "node_rank 3 of 4", "main address s0-0.job", "1234"):
        assert text in decision.reason


def test_fabric_gets_the_host_environment_too(host):
    host(SKYPILOT)
    connector = trainer_plugins.FabricConnector(accelerator="cpu", devices=1, num_nodes=2)
    assert type(connector.cluster_environment) is SkyPilotEnvironment


def test_a_trainer_num_nodes_other_than_the_hosts_raises_when_launching(host):
    host(GKE)
    with pytest.raises(ValueError, match=r"num_nodes=2.*TPU_WORKER_HOSTNAMES='host-0,host-1,host-2'"):
        TPUVMEnvironment().validate_settings(num_devices=1, num_nodes=2)
    TPUVMEnvironment().validate_settings(num_devices=1, num_nodes=3)


def test_the_trainer_picks_the_tpu_vm_environment_and_leaves_the_variables_as_they_were(host, tmp_path):
    host({"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "a,b"})
    before = dict(os.environ)
    trainer = L.Trainer(accelerator="cpu", devices=1, num_nodes=2, default_root_dir=tmp_path, logger=False)
    environment = trainer.strategy.cluster_environment
    assert type(environment) is TPUVMEnvironment
    assert (environment.node_rank(), environment.main_address, trainer.node_rank) == (1, "a", 1)
    assert dict(os.environ) == before


@pytest.mark.xla
def test_an_accelerator_plugin_with_its_own_environment_keeps_it_under_host_variables(host):
    # XLA's runtime reads the TPU VM's variables itself (torch_xla's _internal/tpu.py): its plugin's
    # XLAEnvironment stays the choice on a TPU VM, as before the host environments existed.
    from xla_plugins import XLAEnvironment

    host(GKE)
    (decision,) = [d for d in trainer_plugins.explain(accelerator="tpu", devices=1) if d.role == "environment"]
    assert decision.choice == f"xla ({XLAEnvironment.__module__}.XLAEnvironment)"

"""One Lightning script under every launcher: who starts the processes, their environment, ranks and shards.

tests/scripts/launch_matrix.py (``Trainer(accelerator="tpu", devices="auto", strategy="ddp",
num_nodes=N)`` on the TorchTPU stand-in device, the same text as on ``"cpu"``) runs under plain
``python``, ``torchrun`` (one host x 2, one host x 4, two "hosts" x 2 through a static rendezvous),
Ray Train's ``TorchTrainer`` on a local Ray (where ray is installed: the torchtpu-ray cell) and the
variables of srun, a GKE TPU pod (``TPU_WORKER_ID``/``TPU_WORKER_HOSTNAMES``) and SkyPilot, simulated:
the test starts each host's (or each task's) command itself. Each row of :data:`LAUNCHERS` says how a
launcher starts the script and what every process must report; adding a launcher is one entry. Every
address is 127.0.0.1 and gloo binds the loopback (``GLOO_SOCKET_IFNAME=lo``); every command runs under a
timeout, and its whole process group is killed when it overruns.

The launch table of docs/user-guide.md is checked against :data:`LAUNCHERS`
(:func:`test_the_guides_launch_table_is_the_matrix`). The in-process tests at the end check the two
rules the matrix relies on: ``devices="auto"`` from the launcher, and an existing process group reused.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.util import find_spec
from pathlib import Path

import lightning as L
import pytest
import torch
from test_torchtpu_distributed import _free_port
from torch.utils.data import DataLoader, TensorDataset

pytestmark = pytest.mark.torchtpu
SCRIPT = str(Path(__file__).parent / "scripts" / "launch_matrix.py")
RAY_DRIVER = str(Path(__file__).parent / "scripts" / "torchtpu_ray_train.py")
GUIDE = Path(__file__).parent.parent / "docs" / "user-guide.md"
TIMEOUT = 240  # seconds for one launch, all its processes together
SAMPLES = 64  # the script's dataset
#: Variables of any launcher, removed from the test's own environment before each launch.
LAUNCHER_VARIABLES = re.compile(
    r"(LOCAL_RANK|NODE_RANK|GROUP_RANK|RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_.*"
    r"|SLURM_.*|TPU_WORKER_.*|MEGASCALE_.*|JOB_COMPLETION_INDEX|SKYPILOT_.*|TORCHTPU_PLUGINS_DEVICE_COUNT)"
)

Command = tuple[list[str], dict[str, str]]


def _torchrun(hosts: int, per_host: int, port: str) -> list[Command]:
    """torchrun on every host; two or more hosts meet through a static rendezvous at host 0's agent."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={per_host}"]
    where = ["--master_addr=127.0.0.1", f"--master_port={port}"]
    if hosts == 1:
        return [([*torchrun, *where], {})]
    return [
        ([*torchrun, f"--nnodes={hosts}", f"--node_rank={host}", "--rdzv_backend=static", *where], {})
        for host in range(hosts)
    ]


def _python(hosts: int, per_host: int, port: str) -> list[Command]:
    """The script alone (one host): Lightning's launcher starts a process per device."""
    assert hosts == 1, "plain python has no way to tell a host its place"
    return [([sys.executable], {"TORCHTPU_PLUGINS_DEVICE_COUNT": str(per_host)})]


def _ray(hosts: int, per_host: int, port: str) -> list[Command]:
    """A Ray driver (tests/scripts/torchtpu_ray_train.py) on a local Ray: ``TorchTrainer`` of ``per_host`` workers."""
    assert hosts == 1, "a local Ray is one node"
    # before `import ray`: a local Ray then binds 127.0.0.1 only
    return [([sys.executable, RAY_DRIVER, f"--num_workers={per_host}"], {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})]


def _srun(hosts: int, per_host: int, port: str) -> list[Command]:
    """What srun gives each task (``--nodes=hosts --ntasks-per-node=per_host``); one chip a task."""
    common = {
        "SLURM_JOB_NAME": "matrix",
        "SLURM_JOB_ID": "1",
        "SLURM_NTASKS": str(hosts * per_host),
        "SLURM_NTASKS_PER_NODE": str(per_host),
        "SLURM_NNODES": str(hosts),
        "SLURM_NODELIST": "127.0.0.1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
    }
    return [
        (
            [sys.executable],
            {
                **common,
                "SLURM_PROCID": str(host * per_host + local),
                "SLURM_LOCALID": str(local),
                "SLURM_NODEID": str(host),
            },
        )
        for host in range(hosts)
        for local in range(per_host)
    ]


def _gke(hosts: int, per_host: int, port: str) -> list[Command]:
    """A GKE TPU pod per host (the TPU webhook's variables), each host's script started by hand."""
    names = ",".join(["127.0.0.1"] * hosts)
    return [
        (
            [sys.executable],
            {
                "TPU_WORKER_ID": str(host),
                "TPU_WORKER_HOSTNAMES": names,
                "MASTER_PORT": port,
                "TORCHTPU_PLUGINS_DEVICE_COUNT": str(per_host),
            },
        )
        for host in range(hosts)
    ]


def _skypilot(hosts: int, per_host: int, port: str) -> list[Command]:
    """SkyPilot's variables on every node, each node's script started by hand."""
    ips = "\n".join(["127.0.0.1"] * hosts)
    return [
        (
            [sys.executable],
            {
                "SKYPILOT_NODE_RANK": str(host),
                "SKYPILOT_NODE_IPS": ips,
                "SKYPILOT_NUM_NODES": str(hosts),
                "MASTER_PORT": port,
                "TORCHTPU_PLUGINS_DEVICE_COUNT": str(per_host),
            },
        )
        for host in range(hosts)
    ]


@dataclass(frozen=True)
class Launcher:
    """How a launcher starts the script, and what its processes must report.

    Attributes:
        commands: (hosts, processes per host, port) -> one (argv before the script, variables) per
            command the test starts (a host's, or for srun a task's).
        environment: the cluster environment of each host's first process.
        started_by: who starts the processes: ``"lightning"`` (Lightning's launcher: each host's other
            processes are children of its first, with ``LightningEnvironment``), ``"torchrun"``
            (torchrun's agent: one parent of a host's processes, none of them), ``"scheduler"`` (each
            process its own command, as srun starts tasks), ``"ray"`` (Ray's worker actors: neither
            the command, the Ray driver, nor its children).
        hosts: the host counts the matrix runs it with.
        backend: the default process group's backend (Ray Train makes a ``"gloo"`` one before the
            script runs; DDP then reduces over a ``"tpu_dist"`` group beside it).
    """

    commands: Callable[[int, int, str], list[Command]]
    environment: str
    started_by: str
    hosts: tuple[int, ...]
    backend: str = "tpu_dist"


LAUNCHERS = {
    "python": Launcher(_python, "LightningEnvironment", "lightning", (1,)),
    "torchrun": Launcher(_torchrun, "TorchElasticEnvironment", "torchrun", (1, 2)),
    "srun": Launcher(_srun, "SLURMEnvironment", "scheduler", (2,)),
    "gke": Launcher(_gke, "TPUVMEnvironment", "lightning", (2,)),
    "skypilot": Launcher(_skypilot, "SkyPilotEnvironment", "lightning", (2,)),
    "ray": Launcher(_ray, "RayLightningEnvironment", "ray", (1,), "gloo"),
}
PER_HOST = 2
#: The runs every launch of the same world size must equal: one host, no scheduler.
REFERENCES = {2: ("torchrun", 1, 2), 4: ("torchrun", 1, 4)}


@cache
def _launch(
    name: str, hosts: int, per_host: int, api: str = "trainer", accelerator: str = "tpu", devices: str = "auto"
) -> tuple[tuple[dict, ...], tuple[int, ...]]:
    """Run the script as launcher ``name`` starts it on ``hosts`` x ``per_host`` (cached for the session).

    Returns:
        Every rank's record, by global rank, and the process id of each command the test started.
    """
    base = {key: value for key, value in os.environ.items() if not LAUNCHER_VARIABLES.fullmatch(key)}
    base.update(TORCHTPU_PLUGINS_DEVICE="cpu", GLOO_SOCKET_IFNAME="lo")
    output = tempfile.mkdtemp(prefix=f"launch-{name}-")
    args = [SCRIPT, api, accelerator, devices, str(hosts), output]
    processes: list[subprocess.Popen] = []
    try:
        for index, (argv, variables) in enumerate(LAUNCHERS[name].commands(hosts, per_host, _free_port())):
            with open(os.path.join(output, f"command-{index}.log"), "w") as log:
                processes.append(
                    subprocess.Popen(
                        [*argv, *args],
                        env={**base, **variables},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        for process in processes:
            process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    try:
        for index, process in enumerate(processes):
            text = Path(output, f"command-{index}.log").read_text()
            assert process.returncode == 0, f"{name}: {process.args} exited {process.returncode}:\n{text[-4000:]}"
        records = tuple(torch.load(Path(output, f"rank-{r}.pt"), weights_only=False) for r in range(hosts * per_host))
    finally:
        shutil.rmtree(output)
    return records, tuple(process.pid for process in processes)


#: Launchers whose Python package must be installed (their tox cell: torchtpu-ray).
NEEDS = {"ray": "ray"}
MATRIX = [
    pytest.param(
        name,
        hosts,
        id=f"{name}-{hosts}x{PER_HOST}",
        marks=pytest.mark.skipif(
            name in NEEDS and find_spec(NEEDS[name]) is None,
            reason=f"{NEEDS.get(name)} is not installed (tox -e torchtpu-ray runs this case)",
        ),
    )
    for name, launcher in LAUNCHERS.items()
    for hosts in launcher.hosts
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "hosts"), MATRIX)
def test_launch(name, hosts):
    launcher = LAUNCHERS[name]
    records, commands = _launch(name, hosts, PER_HOST)
    world = hosts * PER_HOST
    assert [r["global_rank"] for r in records] == list(range(world))
    assert {r["world_size"] for r in records} == {world}
    assert [r["local_rank"] for r in records] == [rank % PER_HOST for rank in range(world)]
    assert [r["node_rank"] for r in records] == [rank // PER_HOST for rank in range(world)]
    assert {(r["strategy"], r["backend"]) for r in records} == {("TorchTPUDDPStrategy", launcher.backend)}
    assert {frozenset(r["devices"]) for r in records} == {frozenset({"tpu"})}
    # the environment, and who started each host's processes
    for host in range(hosts):
        first, *others = records[host * PER_HOST : (host + 1) * PER_HOST]
        assert first["environment"] == launcher.environment
        if launcher.started_by == "lightning":  # the host's command is its first process, which starts the others
            assert first["pid"] == commands[host]
            children = [("LightningEnvironment", first["pid"])] * len(others)
            assert [(r["environment"], r["ppid"]) for r in others] == children
        else:
            assert [r["environment"] for r in others] == [launcher.environment] * len(others)
            assert all(r["externally"] for r in (first, *others))
    if launcher.started_by == "torchrun":  # each host's agent (its command) is the parent of the host's processes
        assert [r["ppid"] for r in records] == [commands[rank // PER_HOST] for rank in range(world)]
    if launcher.started_by == "scheduler":  # every process is a command of its own
        assert [r["pid"] for r in records] == list(commands)
    if launcher.started_by == "ray":  # Ray's worker actors: not the driver, nor children of it
        assert not {r[key] for r in records for key in ("pid", "ppid")} & set(commands)
    # the samplers' shards: disjoint, and together the dataset
    shards = [set(r["indices"]) for r in records]
    assert sum(len(shard) for shard in shards) == SAMPLES
    assert set().union(*shards) == set(range(SAMPLES))
    # the same result as one host of the same world size under torchrun
    reference, _ = _launch(*REFERENCES[world])
    _assert_same_training(records[0], reference[0])


def _assert_same_training(run: dict, reference: dict) -> None:
    """Rank 0's shard, losses and final parameters equal the reference's (within 1e-5)."""
    assert run["indices"] == reference["indices"]
    assert len(run["losses"]) == len(reference["losses"]) > 0
    assert run["losses"] == pytest.approx(reference["losses"], abs=1e-5)
    assert run["state"].keys() == reference["state"].keys()
    for key, value in reference["state"].items():
        torch.testing.assert_close(run["state"][key], value, rtol=0, atol=1e-5, msg=key)


@pytest.mark.subprocess
@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_torchrun_on_tpu_equals_torchrun_cpu_ddp_on_gloo(api):
    """torchrun --nproc_per_node=2, devices="auto" on "tpu": torchrun's ranks, no process started, CPU DDP's result."""
    tpu, _ = _launch("torchrun", 1, 2, api)
    cpu, _ = _launch("torchrun", 1, 2, api, "cpu", "2")  # Lightning's CPU accelerator takes "auto" as 1 process
    for run, backend in ((tpu, "tpu_dist"), (cpu, "gloo")):
        assert [(r["environment"], r["externally"], r["world_size"]) for r in run] == [
            ("TorchElasticEnvironment", True, 2)
        ] * 2
        assert [r["global_rank"] for r in run] == [0, 1]
        assert {r["backend"] for r in run} == {backend}
    assert {frozenset(r["devices"]) for r in tpu} == {frozenset({"tpu"})}
    assert tpu[0]["strategy"] == ("TorchTPUDDPStrategy" if api == "trainer" else "FabricTorchTPUDDPStrategy")
    _assert_same_training(tpu[0], cpu[0])


# --- in process: the rules the matrix relies on ------------------------------------------------


@pytest.fixture
def no_launcher(monkeypatch):
    """A clean slate of launcher variables (monkeypatch puts each back after the test)."""
    for name in [name for name in os.environ if LAUNCHER_VARIABLES.fullmatch(name)]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_devices_auto_is_the_launchers_processes_on_this_host(no_launcher):
    from torchtpu_plugins.roles.accelerator import TorchTPUAccelerator

    chips = torch.accelerator.device_count()
    assert TorchTPUAccelerator.auto_device_count() == chips  # no launcher: the chips this process sees
    no_launcher.setenv("LOCAL_WORLD_SIZE", str(chips + 2))  # torchrun, Ray Train
    assert TorchTPUAccelerator.auto_device_count() == chips + 2
    assert TorchTPUAccelerator.parse_devices("auto") == TorchTPUAccelerator.parse_devices(chips + 2) == chips + 2
    with pytest.raises(ValueError, match=rf"valid are 1 to {chips + 2} .*LOCAL_WORLD_SIZE={chips + 2}"):
        TorchTPUAccelerator.parse_devices(chips + 3)
    no_launcher.setenv("LOCAL_WORLD_SIZE", "0")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='0' is not a process count"):
        TorchTPUAccelerator.auto_device_count()
    no_launcher.delenv("LOCAL_WORLD_SIZE")
    # srun: the tasks of this node, where Lightning's SLURMEnvironment detects srun
    for name, value in {"SLURM_NTASKS": "6", "SLURM_NTASKS_PER_NODE": "3", "SLURM_JOB_NAME": "train"}.items():
        no_launcher.setenv(name, value)
    assert TorchTPUAccelerator.auto_device_count() == 3
    no_launcher.setenv("SLURM_JOB_NAME", "interactive")  # an salloc shell: Lightning's own launcher runs
    assert TorchTPUAccelerator.auto_device_count() == chips


class _Steps(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _torchrun_variables(monkeypatch: pytest.MonkeyPatch, world_size: int) -> None:
    """What torchrun gives the only process of a one-process job of ``world_size`` (a lie where it is not 1)."""
    variables = {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "WORLD_SIZE": str(world_size)}
    variables.update(LOCAL_WORLD_SIZE=str(world_size), TORCHELASTIC_RUN_ID="test", MASTER_ADDR="127.0.0.1")
    variables.update(MASTER_PORT=_free_port())
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def existing_group(no_launcher):
    """A one-process "tpu_dist" group started before Lightning (as Ray Train does), destroyed after the test."""
    _torchrun_variables(no_launcher, 1)
    torch.distributed.init_process_group("tpu_dist", rank=0, world_size=1)
    group = torch.distributed.distributed_c10d._get_default_group()
    yield group
    torch.distributed.destroy_process_group()


def _fit(strategy: object) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="tpu",
        devices="auto",
        strategy=strategy,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(_Steps(), DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4))
    return trainer


def test_an_existing_process_group_is_reused_with_its_backend(existing_group):
    from torchtpu_plugins.strategies.ddp import TorchTPUDDPStrategy

    # the strategy is told "gloo", but the group that exists is "tpu_dist": that one is used, and said
    trainer = _fit(TorchTPUDDPStrategy(process_group_backend="gloo"))
    assert torch.distributed.distributed_c10d._get_default_group() is existing_group
    assert trainer.strategy._process_group_backend == "tpu_dist"
    assert type(trainer.strategy.cluster_environment).__name__ == "TorchElasticEnvironment"


def test_an_existing_process_group_of_another_world_size_is_refused(existing_group, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="world size 1 and this process as rank 0, but TorchElasticEnvironment"):
        _fit("ddp")


WHO = {"lightning": "Lightning's launcher", "torchrun": "torchrun's agent", "scheduler": "the scheduler", "ray": "Ray"}


def test_the_guides_launch_table_is_the_matrix():
    """Each row of docs/user-guide.md's launch table states what the matrix asserts for its launcher."""
    text = GUIDE.read_text()
    table = text[text.index("<!-- the rows below are checked against LAUNCHERS") :].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    assert rows.keys() == LAUNCHERS.keys()
    for name, launcher in LAUNCHERS.items():
        assert rows[name][2] == f"`{launcher.environment}`", name
        assert rows[name][3].startswith(WHO[launcher.started_by]), name

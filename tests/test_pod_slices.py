"""The XLA strategies on TPU pod slices (issue 14), tested without a pod.

The world model and the per-host data shares are pure functions, checked over a table of slices.
The strategies' rank properties, data hook-up and ``doctor`` are checked with torch_xla.runtime's
process and device figures replaced by the test double of ``simulated_pod`` (the tests say
``simulated_hosts``); everything else (Lightning, samplers, torch.distributed) is real.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")

import torch  # noqa: E402
from simulated_pod import PER_CHIP, PER_HOST_THREADS, SLICES, Slice, on_host  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

import trainer_plugins  # noqa: E402
from trainer_plugins import resolve_in  # noqa: E402
from xla_plugins.runtime import _world  # noqa: E402
from xla_plugins.runtime._world import RuntimeFigures  # noqa: E402

pytestmark = pytest.mark.xla

SLICE_IDS = [s.name for s in SLICES]


def xla_strategy_classes(kind: str) -> list[tuple[str, str, type]]:
    """Every strategy the XLA plugin registers, as (name, api, class), of one ``kind`` of world.

    ``"per_host"``: built on the one-process-per-host base (``xla_spmd`` and any sharded strategy
    built on it, such as an FSDP one, once registered); ``"per_device"``: one worker per device.
    """
    from xla_plugins._hooks import trainer_plugins_strategies
    from xla_plugins.strategies._mesh import _OneProcessOverAMesh
    from xla_plugins.strategies.xla import _OneWorkerPerDevice

    base = _OneProcessOverAMesh if kind == "per_host" else _OneWorkerPerDevice
    found = []
    for entry in trainer_plugins_strategies():
        for api in ("trainer", "fabric"):
            path = getattr(entry, api)
            cls = resolve_in(path, "lightning") if path else None
            if cls is not None and issubclass(cls, base) and entry.name + api not in {n + a for n, a, _ in found}:
                found.append((entry.name, api, cls))
    return found


PER_HOST = xla_strategy_classes("per_host")
PER_DEVICE = [(n, a, c) for n, a, c in xla_strategy_classes("per_device") if n != "xla_debug"]


def test_the_strategy_tables_hold_every_registered_xla_strategy():
    assert {(n, a) for n, a, _ in PER_HOST} >= {("xla_spmd", "trainer"), ("xla_spmd", "fabric")}
    assert {(n, a) for n, a, _ in PER_DEVICE} == {("xla", "trainer"), ("xla", "fabric")}


# --- the world model over the table of slices ---------------------------------------------------


@pytest.mark.parametrize("layout", [PER_CHIP, PER_HOST_THREADS])
@pytest.mark.parametrize("pod", SLICES, ids=SLICE_IDS)
def test_one_replica_per_device_world_over_slices(pod, layout):
    worlds = {
        (host, device): _world.one_replica_per_device(pod.replica(host, device, layout))
        for host in range(pod.hosts)
        for device in range(pod.devices_per_host)
    }
    assert {w.world_size for w in worlds.values()} == {pod.devices}
    assert {w.num_nodes for w in worlds.values()} == {pod.hosts}
    assert sorted(w.global_rank for w in worlds.values()) == list(range(pod.devices))  # each rank once
    for (host, device), world in worlds.items():
        assert (world.node_rank, world.local_rank) == (host, device)
        assert world.global_rank == pod.shuffled_ordinal(host * pod.devices_per_host + device)  # the ordinal
    # each replica's data: the sampler Lightning injects from {"num_replicas": world_size, "rank": global_rank}
    size = pod.devices * 3
    shares = [
        list(DistributedSampler(range(size), num_replicas=w.world_size, rank=w.global_rank, shuffle=False))
        for w in worlds.values()
    ]
    assert sorted(i for share in shares for i in share) == list(range(size))  # disjoint and covering


@pytest.mark.parametrize("layout", [PER_CHIP, PER_HOST_THREADS])
@pytest.mark.parametrize("pod", SLICES, ids=SLICE_IDS)
def test_one_rank_per_worker_process_and_one_leading_replica_each_over_slices(pod, layout):
    """The spawn strategy's stop agreement: a rank per worker process, led by exactly one of its replicas."""
    figures = [pod.replica(h, d, layout) for h in range(pod.hosts) for d in range(pod.devices_per_host)]
    leaders = [f for f in figures if _world.leads_its_process(f)]
    assert sorted(f.process_index for f in leaders) == list(range(figures[0].process_count))  # one a process
    for f in figures:
        world = _world.one_rank_per_process(f)
        replica = _world.one_replica_per_device(f)
        assert (world.world_size, world.global_rank) == (f.process_count, f.process_index)
        assert (world.node_rank, world.num_nodes) == (replica.node_rank, replica.num_nodes)
        assert world.num_nodes == pod.hosts
    expected = pod.devices if layout == PER_CHIP else pod.hosts
    assert figures[0].process_count == expected


@pytest.mark.parametrize("pod", SLICES, ids=SLICE_IDS)
def test_one_process_per_host_world_over_slices(pod):
    worlds = [_world.one_process_per_host(pod.host(h)) for h in range(pod.hosts)]
    assert worlds == [_world.World(pod.hosts, h, 0, h, pod.hosts) for h in range(pod.hosts)]
    expected = None if pod.hosts == 1 else [{"num_replicas": pod.hosts, "rank": h} for h in range(pod.hosts)]
    kwargs = [_world.host_sampler_kwargs(w) for w in worlds]
    assert kwargs == (expected or [None])


@pytest.mark.parametrize("shuffle", [False, True], ids=["in order", "shuffled"])
@pytest.mark.parametrize("size_per_device_batch", [(0, 3), (5, 2)], ids=["even", "uneven"])
@pytest.mark.parametrize("pod", SLICES, ids=SLICE_IDS)
def test_host_shares_are_disjoint_covering_and_make_each_global_batch(pod, size_per_device_batch, shuffle):
    extra, batch = size_per_device_batch
    size = pod.devices * batch * 4 + extra  # 4 full global batches, plus `extra` samples (uneven: padded)
    shares = [
        _world.host_step_indices(size, _world.one_process_per_host(pod.host(h)), pod.devices_per_host, batch, shuffle)
        for h in range(pod.hosts)
    ]
    steps = {len(share) for share in shares}
    assert len(steps) == 1  # every host runs every step (SPMD needs all hosts in each step)
    loaded = [i for share in shares for step in share for i in step]
    assert set(loaded) == set(range(size))  # covering
    padding = -size % pod.hosts  # DistributedSampler repeats its first indices to make the hosts even, as DDP's
    assert len(loaded) == size + padding
    if padding == 0:
        assert len(set(loaded)) == len(loaded)  # disjoint
    for step in range(steps.pop()):
        global_batch = [i for share in shares for i in share[step]]
        full = step < size // (pod.devices * batch)
        assert len(global_batch) == (pod.devices * batch if full else len(global_batch))
        for share in shares:
            assert len(share[step]) == (batch * pod.devices_per_host if full else len(share[step]))
    if pod.hosts == 1 and not shuffle:  # one host: the loader's own order, dealt out as before
        assert shares[0][0] == list(range(pod.devices_per_host * batch))


def test_inconsistent_runtime_figures_are_refused_naming_the_figure():
    good = SLICES[1].host(0)
    cases = {
        "global_device_count=15": RuntimeFigures(4, 0, 1, 15, 4),
        "process_index=4, outside": RuntimeFigures(4, 4, 1, 16, 4),
        "not a multiple of local_process_count=3": RuntimeFigures(16, 0, 3, 16, 1),
        "process_count=0": RuntimeFigures(0, 0, 1, 16, 4),
    }
    assert _world.check_figures(good) is good
    for message, figures in cases.items():
        with pytest.raises(ValueError, match=message):
            _world.check_figures(figures)
    with pytest.raises(ValueError, match="one process per host, but torch_xla reports local_process_count=4"):
        _world.one_process_per_host(SLICES[1].replica(0, 0, PER_CHIP))


# --- strategies under the double ----------------------------------------------------------------


def build(cls: type) -> object:
    devices = [torch.device("xla", i) for i in range(4)]
    return cls(parallel_devices=devices)


@pytest.mark.parametrize("name,api,cls", PER_HOST, ids=[f"{n}-{a}" for n, a, _ in PER_HOST])
@pytest.mark.parametrize("pod", SLICES, ids=SLICE_IDS)
def test_per_host_strategy_ranks_simulated_hosts(pod, name, api, cls):
    connector = trainer_plugins.Connector(api)
    for h in range(pod.hosts):
        with on_host(pod.host(h)):
            strategy = build(cls)
            ranks = (strategy.world_size, strategy.global_rank, strategy.local_rank, strategy.node_rank)
            assert ranks == (pod.hosts, h, 0, h)
            assert strategy.num_nodes == pod.hosts and strategy.is_global_zero == (h == 0)
            several = pod.hosts > 1
            assert connector.is_distributed(strategy) is several  # drives Lightning's sampler injection
            assert strategy.distributed_sampler_kwargs == ({"num_replicas": pod.hosts, "rank": h} if several else None)


@pytest.mark.parametrize("name,api,cls", PER_DEVICE, ids=[f"{n}-{a}" for n, a, _ in PER_DEVICE])
@pytest.mark.parametrize("pod", SLICES, ids=SLICE_IDS)
def test_per_device_strategy_ranks_simulated_hosts(pod, name, api, cls):
    strategy = build(cls)
    strategy._launched = True  # as inside a worker
    seen = set()
    for host in range(pod.hosts):
        for device in range(pod.devices_per_host):
            with on_host(pod.replica(host, device)):
                assert strategy.world_size == pod.devices
                assert (strategy.node_rank, strategy.local_rank) == (host, device)
                assert strategy.num_nodes == pod.hosts
                assert strategy.distributed_sampler_kwargs == {
                    "num_replicas": pod.devices,
                    "rank": strategy.global_rank,
                }
                seen.add(strategy.global_rank)
    assert seen == set(range(pod.devices))


@pytest.mark.parametrize("pod", SLICES[:2], ids=SLICE_IDS[:2])
def test_trainer_loads_each_host_share_simulated_hosts(pod, tmp_path):
    """A Trainer with xla_spmd on each simulated host injects the host sampler and joins its device batches."""
    import lightning
    from lightning.pytorch.trainer.states import RunningStage

    size, batch = pod.devices * 2 * 3, 2
    loader = DataLoader(TensorDataset(torch.arange(size)), batch_size=batch)
    seen = []
    for h in range(pod.hosts):
        with on_host(pod.host(h)):
            trainer = lightning.Trainer(
                accelerator="xla", devices=pod.devices_per_host, strategy="xla_spmd", default_root_dir=tmp_path,
                logger=False, enable_checkpointing=False, enable_progress_bar=False,
            )  # fmt: skip
            prepared = trainer._data_connector._prepare_dataloader(loader, shuffle=False, mode=RunningStage.TRAINING)
            batches = trainer.strategy.process_dataloader(prepared)
            steps = [b[0].tolist() for b in batches]
            world = trainer.strategy.world
        expected = _world.host_step_indices(size, world, pod.devices_per_host, batch)
        assert steps == expected
        seen.append(steps)
    if pod.hosts > 1:
        assert isinstance(prepared.sampler, DistributedSampler)
    assert sorted(i for steps in seen for step in steps for i in step) == list(range(size))


def test_fabric_injects_the_host_sampler_simulated_hosts():
    import lightning

    pod = SLICES[1]
    loader = DataLoader(TensorDataset(torch.arange(64)), batch_size=2)
    for h in range(pod.hosts):
        with on_host(pod.host(h)):
            fabric = lightning.Fabric(accelerator="xla", devices=pod.devices_per_host, strategy="xla_spmd")
            fabric._launched = True  # as after fabric.launch(), which would enter SPMD mode in this test process
            wrapped = fabric.setup_dataloaders(loader, move_to_device=False)
            sampler = wrapped._dataloader.sampler  # Fabric's wrapper -> the strategy's GlobalBatches -> the loader
            assert isinstance(sampler, DistributedSampler)
            assert (sampler.num_replicas, sampler.rank) == (pod.hosts, h)


def test_one_host_keeps_the_loader_and_injects_nothing():
    import lightning
    from lightning.pytorch.trainer.states import RunningStage

    with on_host(SLICES[0].host(0)):
        trainer = lightning.Trainer(accelerator="xla", devices=4, strategy="xla_spmd", logger=False)
        loader = DataLoader(TensorDataset(torch.arange(16)), batch_size=2)
        prepared = trainer._data_connector._prepare_dataloader(loader, shuffle=False, mode=RunningStage.TRAINING)
        assert prepared is loader
        assert [b[0].tolist() for b in trainer.strategy.process_dataloader(prepared)][0] == list(range(8))


# --- collectives, checkpoints and resume across hosts --------------------------------------------


class RecordingHosts:
    """Host group double: records barriers, reduces nothing (one simulated host of a larger world)."""

    def __init__(self, world: _world.World, events: list[str]) -> None:
        self.world, self.events = world, events

    several = property(lambda self: self.world.world_size > 1)

    def barrier(self) -> None:
        self.events.append(f"barrier {self.world.global_rank}")


@pytest.mark.parametrize("name,api,cls", PER_HOST, ids=[f"{n}-{a}" for n, a, _ in PER_HOST])
def test_checkpoint_is_written_once_by_rank_zero_after_the_barrier_simulated_hosts(name, api, cls, tmp_path):
    """Under a simulated 4-host world: every host syncs and waits, global rank 0 alone writes."""
    pod, path, events = SLICES[1], tmp_path / "last.ckpt", []
    for h in range(pod.hosts):
        with on_host(pod.host(h)):
            strategy = build(cls)
            strategy._hosts = RecordingHosts(strategy.world, events)
            write = strategy.checkpoint_io.save_checkpoint
            strategy.checkpoint_io.save_checkpoint = lambda *a, h=h, write=write, **k: (  # type: ignore[method-assign]
                events.append(f"write {h}"),
                write(*a, **k),
            )
            state = {"state_dict": {"w": torch.full((3,), float(h))}, "global_step": 7}
            if api == "trainer":
                strategy.save_checkpoint(state, path)
            else:
                strategy.save_checkpoint(path, state)
    assert events == ["barrier 0", "write 0", "barrier 1", "barrier 2", "barrier 3"]
    from xla_plugins.checkpoints.checkpoint_io import finish_pending_writes

    finish_pending_writes()  # a Fabric strategy's save returns before its background write ends
    assert torch.load(path)["state_dict"]["w"].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_full_checkpoint_resumes_on_another_host_count_simulated_hosts(hosts, tmp_path):
    """A full checkpoint of a 4-host run loads the same on every host of a 1-, 2- or 3-host run."""
    from xla_plugins.strategies.xla_spmd import XLASPMDStrategy

    path = tmp_path / "four-hosts.ckpt"
    with on_host(SLICES[1].host(0)):
        writer = build(XLASPMDStrategy)
        writer._hosts = RecordingHosts(writer.world, [])
        model = torch.nn.Linear(3, 2)
        writer.save_checkpoint({"state_dict": model.state_dict(), "global_step": 12, "epoch": 1}, path)
    pod = Slice(f"{hosts} hosts", hosts, 4)
    for h in range(hosts):
        with on_host(pod.host(h)):
            reader = build(XLASPMDStrategy)
            assert (reader.world_size, reader.global_rank) == (hosts, h)
            loaded = reader.load_checkpoint(path)
            resumed = torch.nn.Linear(3, 2)
            resumed.load_state_dict(loaded["state_dict"])
            assert loaded["global_step"] == 12
            for key, value in model.state_dict().items():
                assert torch.equal(resumed.state_dict()[key], value)


@pytest.mark.slow  # four interpreters importing torch and Lightning: about a minute on two busy cores
def test_host_collectives_and_checkpoint_across_four_processes_simulated_hosts(tmp_path):
    """Four real processes joined by gloo over a file store, each one simulated host of a 4-host slice.

    Host values reduce, gather and broadcast to DDP's results; a full checkpoint is written once, by
    global rank 0, after the last host reached it (the hosts arrive 0.5 s apart).
    """
    script = tmp_path / "hosts.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            import torch, torch.distributed as dist
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from simulated_pod import SLICES
            from xla_plugins.runtime import _world
            from xla_plugins.strategies._hosts import HostGroup

            rank = int(sys.argv[1])
            dist.init_process_group("gloo", init_method="file://{tmp_path}/store", world_size=4, rank=rank)
            hosts = HostGroup(_world.one_process_per_host(SLICES[1].host(rank)))
            hosts.connect()
            value = torch.tensor([float(rank + 1)])
            out = {{op: hosts.reduce(value, op).tolist() for op in ("sum", "mean", "max", "min")}}
            out["number"] = hosts.reduce(rank, "sum").item()
            out["gather"] = hosts.all_gather(value).tolist()
            out["broadcast"] = hosts.broadcast({{"dir": f"version_{{rank}}"}}, src=0)
            hosts.barrier()

            # a full checkpoint, in a real XLASPMDStrategy of each simulated host; later hosts arrive later
            import time
            from simulated_pod import on_host
            from xla_plugins.strategies.xla_spmd import XLASPMDStrategy

            events = open("{tmp_path}/events", "a", buffering=1)
            with on_host(SLICES[1].host(rank)):
                strategy = XLASPMDStrategy(parallel_devices=[torch.device("xla", i) for i in range(4)])
                strategy._join_hosts()  # the gloo group is open already: joined, checked against the figures
                out["decisions"] = [
                    strategy.reduce_boolean_decision(rank == 0),  # all: only host 0 says yes
                    strategy.reduce_boolean_decision(rank == 0, all=False),  # any
                    strategy.reduce_boolean_decision(True),
                ]
                write = strategy.checkpoint_io.save_checkpoint
                def spy(*args, **kwargs):
                    events.write(f"write {{rank}} {{time.time()}}\\n")
                    write(*args, **kwargs)
                strategy.checkpoint_io.save_checkpoint = spy
                time.sleep(0.5 * rank)
                events.write(f"enter {{rank}} {{time.time()}}\\n")
                strategy.save_checkpoint({{"w": torch.full((3,), float(rank))}}, "{tmp_path}/full.ckpt")
            print(json.dumps(out))
            """
        )
    )
    import subprocess

    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for r in range(4)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    for result in results:  # DDP's values over ranks holding 1, 2, 3, 4
        assert result["sum"] == [10.0] and result["mean"] == [2.5]
        assert result["max"] == [4.0] and result["min"] == [1.0]
        assert result["number"] == 6 and result["gather"] == [[1.0], [2.0], [3.0], [4.0]]
        assert result["broadcast"] == {"dir": "version_0"}
        assert result["decisions"] == [False, True, True]  # ModelCheckpoint's and EarlyStopping's decisions
    events = [line.split() for line in (tmp_path / "events").read_text().splitlines()]
    writes = [(int(rank), float(at)) for kind, rank, at in events if kind == "write"]
    entries = [float(at) for kind, _, at in events if kind == "enter"]
    assert len(entries) == 4 and [rank for rank, _ in writes] == [0]  # written once, by global rank 0
    assert writes[0][1] >= max(entries)  # after the last host arrived
    assert torch.load(tmp_path / "full.ckpt")["w"].tolist() == [0.0, 0.0, 0.0]


def test_a_process_group_of_another_size_is_refused():
    from xla_plugins.strategies._hosts import HostGroup

    hosts = HostGroup(_world.World(4, 1, 0, 1, 4))
    with pytest.MonkeyPatch.context() as patch:
        import torch.distributed as dist

        patch.setattr(dist, "is_initialized", lambda: True)
        patch.setattr(dist, "get_world_size", lambda: 2)
        patch.setattr(dist, "get_rank", lambda: 1)
        with pytest.raises(RuntimeError, match="world size 2 and rank 1, but torch_xla reports 4 hosts"):
            hosts.connect()


@pytest.mark.parametrize("name,api,cls", PER_HOST, ids=[f"{n}-{a}" for n, a, _ in PER_HOST])
def test_one_host_boolean_decisions_are_the_hosts_own(name, api, cls):
    strategy = build(cls)
    assert [strategy.reduce_boolean_decision(d, all=a) for d in (True, False) for a in (True, False)] == [
        True,
        True,
        False,
        False,
    ]


def test_one_host_collectives_are_local_and_xla_tensors_global_on_several():
    from xla_plugins.strategies._hosts import HostGroup

    one = HostGroup(_world.World(1, 0, 0, 0, 1))
    value = torch.tensor([3.0])
    assert one.reduce(value, "sum") is value and one.all_gather(value) is value
    assert one.broadcast("x") == "x"
    several = HostGroup(_world.World(4, 2, 0, 2, 4))
    import torch_xla

    on_device = torch.tensor([3.0], device=torch_xla.device())
    assert several.reduce(on_device, "sum") is on_device and several.all_gather(on_device) is on_device
    with pytest.raises(ValueError, match="got reduce_op='product'"):
        several.reduce(value, "product")


# --- doctor --------------------------------------------------------------------------------------


def doctor_xla(capsys) -> dict:
    from importlib.metadata import version

    from trainer_plugins._cli import main

    assert main(["--json", "doctor"]) == 0
    backends = json.loads(capsys.readouterr().out)["backends"]
    return backends[f"xla (xla-plugins {version('xla-plugins')})"]


def test_doctor_prints_the_runtime_view_and_what_may_differ_simulated_hosts(capsys, monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    with on_host(SLICES[3].host(5)):
        report = doctor_xla(capsys)
    assert {k: report[k] for k in ("host index", "host count", "local device count", "global device count")} == {
        "host index": 5,
        "host count": 8,
        "local device count": 8,
        "global device count": 64,
    }
    assert report["device count"] == 8
    warning = report["warning 1"]
    assert warning.startswith("8 hosts: every host must run the same versions (torch ")
    assert "compare this output across hosts (run it with --worker=all)" in warning
    assert "warning 2" not in report


def test_doctor_warns_when_pjrt_device_is_left_to_each_host_simulated_hosts(monkeypatch):
    from xla_plugins._doctor import host_warnings

    monkeypatch.delenv("PJRT_DEVICE", raising=False)  # torch_xla is imported already: only doctor's rule reads it
    warnings = host_warnings(SLICES[1].host(0))
    assert warnings[0].startswith("PJRT_DEVICE is not set: each host picks its own device type")
    assert warnings[1].startswith("4 hosts: every host must run the same versions")
    assert host_warnings(RuntimeFigures(4, 0, 1, 12, 4))[-1] == (
        "12 global devices are not 4 hosts x 4 local devices: the hosts have different device counts"
    )


def test_doctor_on_one_host_warns_about_nothing_simulated_hosts(capsys):
    with on_host(SLICES[0].host(0)):
        report = doctor_xla(capsys)
    assert (report["host index"], report["host count"], report["global device count"]) == (0, 1, 4)
    assert not [key for key in report if key.startswith("warning")]


@pytest.mark.slow  # SPMD on 4 PJRT CPU devices in a fresh interpreter
def test_a_host_share_sent_with_minibatch_sharding_matches_the_one_host_sharding():
    """torch_xla's minibatch input path (several hosts) really runs: on one host its shards are mark_sharding's."""
    from conftest import run_python

    code = """
        import json
        import numpy as np, torch, torch_xla, torch_xla.runtime as xr, torch_xla.distributed.spmd as xs
        xr.use_spmd()
        from xla_plugins.strategies._mesh import _send_host_share
        mesh = xs.Mesh(np.arange(4), (4,), ("data",))
        batch = torch.arange(16.0).reshape(8, 2)
        sent = _send_host_share(batch, mesh, "data", torch_xla.device())
        marked = batch.to(torch_xla.device())
        xs.mark_sharding(marked, mesh, ("data", None))
        torch_xla.sync(wait=True)
        def shards(t):
            pieces = torch_xla._XLAC._get_local_shards([t])[0]
            return [s.tolist() for s, d in sorted(pieces, key=lambda item: int(item[1].split(":")[1]))]
        print(json.dumps({"sent": shards(sent), "marked": shards(marked), "value": sent.cpu().tolist()}))
    """
    result = run_python(code, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}, timeout=300)
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["sent"] == out["marked"] == [[[0.0, 1.0], [2.0, 3.0]], [[4.0, 5.0], [6.0, 7.0]],
                                            [[8.0, 9.0], [10.0, 11.0]], [[12.0, 13.0], [14.0, 15.0]]]  # fmt: skip
    assert out["value"] == torch.arange(16.0).reshape(8, 2).tolist()


@pytest.mark.slow  # two interpreters, each an SPMD fit on 4 PJRT CPU devices
def test_trainer_fits_on_two_simulated_hosts_each_with_its_share(tmp_path):
    """tests/scripts/pod_fit.py on two simulated hosts: ranks, data shares, host values, one checkpoint,
    which then resumes on one host."""
    import os
    import subprocess

    script = Path(__file__).parent / "scripts" / "pod_fit.py"
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4")
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "env": env}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path)], **pipes) for r in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for rank, result in enumerate(results):
        assert (result["rank"], result["world_size"], result["num_nodes"]) == (rank, 2, 2)
        assert result["is_global_zero"] == (rank == 0)
        assert result["steps"] == 4  # 32 samples per host, 8 per step (2 per device x 4 devices)
        assert result["host_tensor"] == 3.0  # a CPU tensor logged with sync_dist: summed over the hosts
        assert result["host_number"] == rank + 1  # a number becomes an XLA tensor: taken as global
    seen = [set(result["seen"]) for result in results]
    assert len(results[0]["seen"]) == len(results[1]["seen"]) == 32
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(64))  # disjoint, covering
    assert [p.name for p in tmp_path.rglob("*.ckpt")] == ["epoch=0-step=4.ckpt"]  # written once
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == ["version_0"]  # one log directory
    # the 2-host checkpoint resumes on 1 host: 8 steps an epoch there (64 samples, 8 per step)
    resume = [sys.executable, str(script), "0", str(tmp_path / "one"), "1", results[0]["checkpoint"]]
    done = subprocess.run(resume, timeout=300, **{k: v for k, v in pipes.items() if k != "stdin"})
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = json.loads(done.stdout.strip().splitlines()[-1])
    assert (resumed["world_size"], resumed["steps"], resumed["epoch"]) == (1, 4 + 8, 2)
    assert sorted(resumed["seen"]) == list(range(64))  # one host loads the whole data set


@pytest.mark.slow  # two interpreters, each an SPMD fit on 4 PJRT CPU devices
def test_sigterm_to_one_simulated_host_stops_every_host_at_one_step_with_one_checkpoint(tmp_path):
    """SIGTERM reaches host 1 alone in its training_step at global step 2: both hosts stop after the same
    batch (they agree at the next batch's start), one stop checkpoint holds that step, both exit 143."""
    import os
    import subprocess

    import torch

    script = Path(__file__).parent / "scripts" / "pod_fit.py"
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4", STOP_HOST="1", STOP_AT="2")
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "env": env}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path)], **pipes) for r in range(2)]
    stopped = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)  # no host is left waiting for the other
        assert proc.returncode == 143, err[-3000:]
        stopped.append(json.loads(out.strip().splitlines()[-1])["stopped_at"])
    assert stopped[0] == stopped[1] == 4  # the batch in flight (step 3) and the one at whose start they agreed
    checkpoints = list(tmp_path.rglob("*.ckpt"))
    assert [p.name for p in checkpoints] == ["last-stopped.ckpt"]
    assert torch.load(checkpoints[0], map_location="cpu", weights_only=False)["global_step"] == 4


@pytest.mark.slow  # two interpreters, each a spawn fit on 2 replica threads (tests/xla_cpu_harness.py)
def test_sigterm_to_one_simulated_host_stops_every_spawn_replica_of_every_host_at_one_step(tmp_path):
    """The spawn strategy ("xla") on two simulated hosts of 2 devices: SIGTERM reaches host 1's main process
    alone at global step 3; every replica of both hosts stops after the same batch, one stop checkpoint holds
    that step, both hosts exit 143. Without the agreement host 0 trained to the end of the epoch."""
    import os
    import subprocess

    import torch
    from xla_cpu_harness import required_environment

    from xla_plugins.long_runs._stop_agreement import STOP_MARGIN_BATCHES

    script = Path(__file__).parent / "scripts" / "spawn_pod_stop.py"
    env = dict(os.environ, **required_environment(2), STOP_HOST="1", STOP_AT="3", XLA_PLUGINS_REPLICA_TIMEOUT="120")
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "env": env}
    procs = [subprocess.Popen([sys.executable, str(script), str(h), str(tmp_path)], **pipes) for h in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)  # no host is left waiting for the other
        assert proc.returncode == 143, err[-3000:]
    lines = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]
    assert sorted((line["host"], line["how"]) for line in lines) == [(0, "stopped")] * 2 + [(1, "stopped")] * 2
    assert sorted(line["rank"] for line in lines) == [0, 1, 2, 3]
    # host 1's signal arrives in its 4th batch; the hosts agree at the start of the 5th (the most batches any
    # replica started: 5), and all stop STOP_MARGIN_BATCHES after it, at one global step
    stopped_at = 5 + STOP_MARGIN_BATCHES
    assert {line["global_step"] for line in lines} == {stopped_at}
    checkpoints = list(tmp_path.rglob("*.ckpt"))
    assert [p.name for p in checkpoints] == ["last-stopped.ckpt"]
    assert torch.load(checkpoints[0], map_location="cpu", weights_only=False)["global_step"] == stopped_at

"""The real torch-tpu 0.2.0 on a machine without TPU: probes, doctor and the pre-start environment (tox cell
``torchtpu-probes``).

Every interpreter that loads torch-tpu runs under ``unshare -n`` (a network namespace with no interface up:
nothing can leave the machine) and a timeout, with its ``connect``/``sendto``/``sendmsg`` calls counted by
strace: a probe that tried the cloud metadata server would show there even though the namespace stops it.
Where either tool cannot run (not root, no strace), the tests skip with that reason; they never run with
the network up. The pytest process itself keeps torch's backend autoload off, so torch-tpu never loads in it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, version

import pytest

pytestmark = pytest.mark.torchtpu_probes

#: Seconds the whole interpreter may take (importing torch with torch-tpu costs 4 to 10 s here).
PROCESS_TIMEOUT_S = 120
#: Seconds an answer may take once torch is imported: trainer-plugins' probe timeout, ample for files and metadata.
ANSWER_S = 5.0


def _torch_tpu_version() -> str:
    try:
        return version("torch-tpu")
    except PackageNotFoundError:
        return ""


def _cut_off_reason() -> str:
    """Why interpreters cannot run with the network cut and their calls counted here ('' when they can)."""
    if shutil.which("unshare") is None or shutil.which("strace") is None:
        return "needs unshare and strace to cut the network and count network calls"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"`unshare -n` is not possible here (root needed): {probe.stderr.strip()}"
    return ""


@pytest.fixture(scope="module")
def cut_off():
    if _torch_tpu_version() != "0.2.0":
        pytest.skip(f"needs torch-tpu 0.2.0 installed (found {_torch_tpu_version() or 'none'})")
    reason = _cut_off_reason()
    if reason:
        pytest.skip(reason)
    return run_cut_off


def run_cut_off(args: list[str], tmp_path, env=None) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``args`` (an interpreter of this environment) with the network cut; (result, its network calls).

    torch's backend autoload is on, so ``import torch`` loads torch-tpu as it would for a user.
    """
    trace = tmp_path / "network-calls.txt"
    environ = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1", **(env or {})}
    environ.pop("TORCHTPU_PLUGINS_DEVICE", None)
    command = ["unshare", "-n", "strace", "--seccomp-bpf", "-f", "-qq", "-e", "trace=connect,sendto,sendmsg"]
    command += ["-o", str(trace), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, env=environ)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    calls = trace.read_text().splitlines()
    # the only calls allowed: local sockets (AF_UNIX: the name-service cache, ...) and the kernel's (AF_NETLINK)
    network = [line for line in calls if re.search(r"AF_INET6?\b", line)]
    return result, network


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _last_json(result: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(result.stdout.splitlines()[-1])


def test_tpu_is_not_available_with_its_reason_within_seconds_and_nothing_sent(cut_off, tmp_path):
    code = """
    import json, sys, time
    from trainer_plugins import PluginManager
    manager = PluginManager()
    manager.load_entry_points()
    started = time.monotonic()
    before_torch = manager.call_first("trainer_plugins_accelerator_available", name="torchtpu")[1]
    before_torch_s = time.monotonic() - started
    torch_imported_by_probe = "torch" in sys.modules
    import torch
    loaded = sorted(name for name in ("torch_tpu", "torch_tpu._loader") if name in sys.modules)
    started = time.monotonic()
    after_torch = manager.call_first("trainer_plugins_accelerator_available", name="torchtpu")[1]
    from torchtpu_plugins.runtime import _probes
    reason = _probes.unavailable_reason()
    after_torch_s = time.monotonic() - started
    import lightning
    errors = {}
    for name in ("torchtpu", "tpu"):
        try:
            lightning.Trainer(accelerator=name, logger=False)
        except Exception as error:
            errors[name] = f"{type(error).__name__}: {error}"
    started = time.monotonic()
    auto = type(lightning.Trainer(accelerator="auto", logger=False).accelerator).__name__
    auto_s = time.monotonic() - started
    print(json.dumps({
        "before_torch": before_torch, "before_torch_s": before_torch_s, "imported": torch_imported_by_probe,
        "loaded": loaded, "after_torch": after_torch, "after_torch_s": after_torch_s, "reason": reason,
        "errors": errors, "auto": auto, "auto_s": auto_s,
        "privateuse1": torch._C._get_privateuse1_backend_name(),
    }))
    """
    result, network = cut_off(_python(code), tmp_path)
    report = _last_json(result)
    assert report["loaded"] == ["torch_tpu", "torch_tpu._loader"]  # the real torch-tpu loaded at `import torch`
    assert report["privateuse1"] == "privateuseone"  # ... and, with no chip, registered no device
    # not available, decided from files before torch is imported, then from torch.accelerator, in seconds
    assert (report["before_torch"], report["imported"], report["after_torch"]) == (False, False, False)
    assert report["before_torch_s"] < ANSWER_S and report["after_torch_s"] < ANSWER_S and report["auto_s"] < ANSWER_S
    assert "torch-tpu is installed, but this host has no TPU chip" in report["reason"]
    assert report["errors"]["torchtpu"] == (
        f"RuntimeError: plugin torchtpu (torchtpu-plugins {version('torchtpu-plugins')}): accelerator 'tpu' (TorchTPU)"
        f" is not available: {report['reason']}"
    )
    # xla-plugins is installed too: "tpu" serves neither, and the error says how to pick one
    assert report["errors"]["tpu"].startswith("PluginConflictError: accelerator 'tpu' is claimed by")
    assert "for torchtpu (torchtpu-plugins" in report["errors"]["tpu"]
    assert "accelerator='torchtpu', or TRAINER_PLUGINS_BLOCK=xla-plugins" in report["errors"]["tpu"]
    assert report["auto"] == "CPUAccelerator"
    assert network == []


def test_doctor_shows_the_torchtpu_rows_and_who_serves_tpu(cut_off, tmp_path):
    cli = os.path.join(os.path.dirname(sys.executable), "trainer-plugins")
    result, network = cut_off([cli, "--json", "doctor"], tmp_path)
    report = json.loads(result.stdout)
    rows = report["backends"][f"torchtpu (torchtpu-plugins {version('torchtpu-plugins')})"]
    torch_version = version("torch")
    assert rows["torch-tpu"] == "0.2.0" and rows["libtpu"] == version("libtpu")
    assert rows["torch pair"] == f"torch {torch_version} within torch-tpu's torch<=2.15.0,>=2.11.0"
    assert rows["TPU chips seen"] == "0 (no PCI device of vendor 0x1ae0 with its /dev/vfio group)"
    assert (
        rows["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "1"
        and rows["stand-in device"] == "off (TORCHTPU_PLUGINS_DEVICE unset)"
    )
    assert rows["set before `import torch`"] == (
        "TORCH_DEVICE_BACKEND_AUTOLOAD, TORCHTPU_PLUGINS_DEVICE (read once, when torch loads its backends)"
    )
    assert rows["set before the workers start"].startswith("TORCH_TPU_SLICEBUILDER_ADDRESSES unset")
    assert rows["available"] == "no" and "this host has no TPU chip" in rows["'tpu' devices"]
    assert report["availability"]["torchtpu"] == "not available"
    served = report["conflicts"]["accelerator 'tpu'"]
    assert served.startswith("'tpu' serves none of them; for torchtpu (torchtpu-plugins")
    assert "for xla (xla-plugins" in served and "accelerator='xla', or TRAINER_PLUGINS_BLOCK=torchtpu-plugins" in served
    assert network == []


#: Layouts: (name, variables set before, nnodes, nproc_per_node). No host name is ever contacted.
LAYOUTS = [
    ("one host, 4 chips, topology given", {"TORCH_TPU_TOPOLOGY": "2,2,1"}, 1, 4),
    ("one host, no chip, no topology", {}, 1, 4),
    ("two hosts of 4, GKE indexed job", {"TPU_WORKER_HOSTNAMES": "t-0,t-1", "JOB_COMPLETION_INDEX": "1"}, 2, 4),
    (
        "4-host slice of a multislice job, ports and engine's MASTER_PORT given",
        {
            "TPU_WORKER_HOSTNAMES": "s1-0,s1-1,s1-2,s1-3",
            "JOB_COMPLETION_INDEX": "3",
            "TORCH_TPU_TOPOLOGY": "4,4,1",
            "TORCH_TPU_BASE_PORT": "9100",
            "TORCH_TPU_DEVICES_PER_HOST": "4",
            "MASTER_PORT": "1234",
            "MEGASCALE_NUM_SLICES": "2",
            "MEGASCALE_SLICE_ID": "1",
        },
        None,
        4,
    ),
    ("two hosts, no index", {"TPU_WORKER_HOSTNAMES": "t-0,t-1"}, None, 4),
    ("index without host names", {"JOB_COMPLETION_INDEX": "0"}, None, 4),
    ("num_nodes disagrees with host names", {"TPU_WORKER_HOSTNAMES": "t-0,t-1"}, 3, 4),
]


def test_launch_environment_agrees_with_set_tpu_launch_env(cut_off, tmp_path):
    # one interpreter imports torch (and torch-tpu); each layout runs in a forked child, as torch-tpu reads
    # these variables once per process
    code = f"""
    import json, os, sys
    import torch
    from torchtpu_plugins.roles import _launch_environment
    from torchtpu_plugins.runtime import _pci
    layouts = {[(name, variables, nnodes, nproc) for name, variables, nnodes, nproc in LAYOUTS]!r}
    def answer(function):
        try:
            return function()
        except (ValueError, RuntimeError) as error:
            return type(error).__name__
    for name, variables, nnodes, nproc in layouts:
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            os.environ.update(variables)
            before = dict(os.environ)
            theirs = answer(lambda: _launch_environment.from_torch_tpu(nnodes, nproc))
            untouched = dict(os.environ) == before
            ours = answer(lambda: _launch_environment.derive(dict(os.environ), nnodes, nproc, _pci.tpu_chips()))
            os.write(write, json.dumps([name, theirs, ours, untouched]).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            print(pipe.read())
        os.waitpid(child, 0)
    print(json.dumps({{"torch_tpu": "torch_tpu" in sys.modules}}))
    """
    result, network = cut_off(_python(code), tmp_path)
    lines = result.stdout.splitlines()
    assert json.loads(lines[-1]) == {"torch_tpu": True}
    found = {
        name: (theirs, ours, untouched)
        for name, theirs, ours, untouched in map(json.loads, lines[-1 - len(LAYOUTS) : -1])
    }
    assert list(found) == [name for name, *_ in LAYOUTS]
    for name, (theirs, ours, untouched) in found.items():
        assert untouched, f"{name}: calling set_tpu_launch_env changed os.environ"
        if isinstance(theirs, dict):  # the profiling session id comes from the clock: present in both, digits
            assert (
                theirs.pop("TORCH_TPU_XPROF_SESSION_ID").isdigit() and ours.pop("TORCH_TPU_XPROF_SESSION_ID").isdigit()
            )
        if name.startswith("one host, 4 chips"):  # unused local ports, picked at random: their form
            for variables in (theirs, ours):
                addresses = variables.pop("TORCH_TPU_SLICEBUILDER_ADDRESSES").split(",")
                assert [address.split(":")[0] for address in addresses] == ["localhost"] * 4, name
                assert len({address.split(":")[1] for address in addresses}) == 4, name
        assert ours == theirs, name
    # what the layouts gave (torch-tpu 0.2.0's values, which ours equal)
    assert found["one host, 4 chips, topology given"][0] == {}
    assert found["one host, no chip, no topology"][0] == "ValueError"
    two_hosts = {
        "TORCH_TPU_SLICEBUILDER_ADDRESSES": ",".join(f"t-{h}:{8070 + i}" for h in range(2) for i in range(4)),
        "NNODES": "2",
        "NODE_RANK": "1",
        "MASTER_ADDR": "t-0",
        "MASTER_PORT": "29500",
    }
    assert found["two hosts of 4, GKE indexed job"][0] == two_hosts
    assert found["4-host slice of a multislice job, ports and engine's MASTER_PORT given"][0] == {
        "TORCH_TPU_SLICEBUILDER_ADDRESSES": ",".join(f"s1-{h}:{9100 + i}" for h in range(4) for i in range(4)),
        "NNODES": "4",
        "NODE_RANK": "3",
        "MASTER_ADDR": "s1-0",
    }
    for refused in ("two hosts, no index", "index without host names", "num_nodes disagrees with host names"):
        assert found[refused][0] == "ValueError", refused
    assert network == []


def test_hook_answers_for_an_outside_launcher_only_what_every_worker_derives_alike(cut_off, tmp_path):
    code = """
    import json, os
    import torch
    from torchtpu_plugins.roles import _launch_environment
    found = {}
    os.environ.update({"TPU_WORKER_HOSTNAMES": "t-0,t-1", "JOB_COMPLETION_INDEX": "0"})
    found["outside, two hosts"] = _launch_environment.for_run(2, 4, started_externally=True)
    found["ours, two hosts"] = sorted(_launch_environment.for_run(2, 4, started_externally=False))
    for name in ("TPU_WORKER_HOSTNAMES", "JOB_COMPLETION_INDEX"):
        del os.environ[name]
    try:
        _launch_environment.for_run(1, 4, started_externally=True)
    except ValueError as error:
        found["outside, one host"] = str(error)
    print(json.dumps(found))
    """
    result, network = cut_off(_python(code), tmp_path)
    found = _last_json(result)
    addresses = ",".join(f"t-{h}:{8070 + i}" for h in range(2) for i in range(4))
    assert found["outside, two hosts"] == {"TORCH_TPU_SLICEBUILDER_ADDRESSES": addresses}
    assert found["ours, two hosts"] == sorted(
        [
            "TORCH_TPU_XPROF_SESSION_ID",
            "TORCH_TPU_SLICEBUILDER_ADDRESSES",
            "NNODES",
            "NODE_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
        ]
    )
    assert found["outside, one host"].startswith(
        "these 4 TorchTPU workers on one host were started by an outside launcher"
    )
    assert network == []

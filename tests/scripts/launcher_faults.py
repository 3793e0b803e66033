"""Replicas of a 4-device Fabric spawn run that exit, are killed or hang; report what the main process sees.

``launcher_faults.py report``: runs each fault in turn (a fresh launch each time) and prints one JSON
object mapping the fault to the error the main process raised (or, for a launch whose replicas return their
rank with rank 0 the first, to the value it returned). ``launcher_faults.py orphan DIR``:
starts a launch whose replicas wait forever, after writing the worker's process id to DIR/worker.pid
(the test then kills this main process).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import xla_cpu_harness  # noqa: E402

xla_cpu_harness.install()

import lightning as L  # noqa: E402

DEVICES = 4
#: The replica timeout of the hung and the slow-but-moving cases. The watch times a replica from its start, and a
#: replica's start-up (Lightning's worker setup, the XLA runtime) took more than 3 s on a loaded
#: 2-core machine: the first replica to start was then reported in place of the hung one.
HANG_TIMEOUT = "10"
#: All replica threads of the one PJRT CPU worker meet here before a fault, so every rank has started.
started = threading.Barrier(DEVICES)


def exits(fabric: L.Fabric) -> None:
    started.wait()
    if fabric.global_rank == 2:
        os._exit(3)
    threading.Event().wait()


def is_killed(fabric: L.Fabric) -> None:
    started.wait()
    if fabric.global_rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Event().wait()


def hangs(fabric: L.Fabric) -> None:
    # Every replica makes progress here once its start-up is done, so rank 1's progress is the oldest
    # from then on (the others return and stamp again) whatever the start-ups took.
    fabric.barrier()
    if fabric.global_rank == 1:
        threading.Event().wait()  # the hung replica; the others wait for it in the end-of-run rendezvous


def slow_but_moving(fabric: L.Fabric) -> None:
    for _ in range(12):  # 12 s in all, under a 10 s replica timeout: each barrier is progress
        time.sleep(1.0)
        fabric.barrier()


def returns_its_rank(fabric: L.Fabric) -> int:
    if fabric.global_rank != 0:
        time.sleep(2.0)  # rank 0 returns first: what the others return later must not replace its result
    return fabric.global_rank


def waits_forever(fabric: L.Fabric, folder: str) -> None:
    if fabric.global_rank == 0:
        with open(os.path.join(folder, "worker.pid.tmp"), "w") as file:
            file.write(str(os.getpid()))
        os.replace(os.path.join(folder, "worker.pid.tmp"), os.path.join(folder, "worker.pid"))
    threading.Event().wait()


def outcome(function, timeout: str = "0") -> dict:
    os.environ["XLA_PLUGINS_REPLICA_TIMEOUT"] = timeout
    fabric = L.Fabric(accelerator="xla", devices=DEVICES, strategy="xla")
    began = time.monotonic()
    try:
        value = fabric.launch(function)
    except BaseException as error:  # noqa: BLE001 - reported to the test
        return {
            "type": type(error).__name__,
            "message": str(error),
            "ranks": getattr(error, "ranks", None),
            "rank": getattr(error, "rank", None),
            "exitcode": getattr(error, "exitcode", None),
            "cause": str(error.__cause__) if error.__cause__ is not None else None,
            "seconds": time.monotonic() - began,
        }
    return {"type": None, "value": value}


if __name__ == "__main__":
    if sys.argv[1] == "orphan":
        L.Fabric(accelerator="xla", devices=DEVICES, strategy="xla").launch(waits_forever, sys.argv[2])
    else:
        report = {
            "exits": outcome(exits),
            "is_killed": outcome(is_killed),
            "hangs": outcome(hangs, timeout=HANG_TIMEOUT),
            "slow_but_moving": outcome(slow_but_moving, timeout=HANG_TIMEOUT),
            "returns_its_rank": outcome(returns_its_rank),
        }
        print(json.dumps(report))

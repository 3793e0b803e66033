"""torch_xla runtime checks shared by every XLA role: presence, version, PJRT, device count.

Importing this module imports neither torch nor torch_xla; each function imports torch_xla only
when it has to.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import math
import multiprocessing
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import TYPE_CHECKING, Optional

from packaging.version import Version

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

log = logging.getLogger("xla_plugins")

#: Oldest torch_xla this plugin runs on (``torch_xla.device``/``torch_xla.sync``/``torch_xla.runtime``).
MIN_TORCH_XLA = Version("2.8")
#: Seconds the PJRT device probe may take (a TPU host needs a few seconds to start its client).
PROBE_TIMEOUT_S = 180.0
_INSTALL_HINT = "pip install 'xla-plugins' (which pulls torch_xla), or pip install 'torch_xla==<your torch version>'"


def seconds_from_environment(variable: str, default: float, meaning: str) -> float:
    """Seconds (a finite number >= 0) from environment variable ``variable``; ``default`` when unset or blank.

    Args:
        variable: name of the environment variable, e.g. ``XLA_PLUGINS_REPLICA_TIMEOUT``.
        default: seconds returned when the variable is unset or blank.
        meaning: what the seconds are for, quoted in the error ("the seconds a replica may ...").

    Raises:
        ValueError: the value is not a finite number >= 0; the message names the variable, its
            value, what it means and the default.
    """
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"{variable}={text!r} is not valid: give {meaning}, a number >= 0 (default {default:g}).")
    return seconds


def torch_xla_version() -> Version | None:
    """The installed torch_xla version from package metadata (no import), or ``None``."""
    try:
        return Version(version("torch_xla"))
    except PackageNotFoundError:
        return None


def importable(name: str) -> bool:
    """Whether module ``name`` can be imported for real, without importing it.

    ``False`` for a module that is not installed, and for a stand-in in ``sys.modules`` without a
    ``__spec__`` (test suites stub ``torch_xla`` to fake a TPU): ``importlib.util.find_spec`` raises
    ``ValueError`` for those, which must mean "not available", never an error.
    """
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def require_torch_xla() -> ModuleType:
    """Import and return ``torch_xla`` after checking that it can drive this run.

    Mirrors the checks of Lightning's ``XLAAccelerator`` (torch_xla present, PJRT runtime) with the
    version floor of this plugin. If ``PJRT_DEVICE`` is unset, torch_xla picks a device itself
    (TPU when a TPU is attached, else CPU); that choice is logged, never silent.

    Raises:
        ModuleNotFoundError: torch_xla is not installed (``name="torch_xla"``).
        RuntimeError: torch_xla is older than :data:`MIN_TORCH_XLA`, or the runtime is not PJRT
            (the XRT runtime is not supported anymore).
    """
    installed = torch_xla_version()
    if installed is None or not importable("torch_xla"):
        stub = installed is not None and "torch_xla" in sys.modules
        raise ModuleNotFoundError(
            "The XLA plugin needs torch_xla, but sys.modules['torch_xla'] is a stand-in without __spec__ (a stub)."
            if stub
            else f"The XLA plugin needs torch_xla>={MIN_TORCH_XLA}, which is not installed. {_INSTALL_HINT}.",
            name="torch_xla",
        )
    _check_versions(installed)
    chosen_by_user = os.environ.get("PJRT_DEVICE")
    with _default_device_notice_left_to_us():
        import torch_xla
    import torch_xla.runtime as xr

    if xr.device_type() is None:
        raise RuntimeError(
            "The XLA XRT runtime is not supported anymore; set PJRT_DEVICE (TPU, CPU, CUDA, ...) to use PJRT."
        )
    if not chosen_by_user:
        _log_default_device(xr.device_type())
    return torch_xla


#: The torch release each supported torch_xla series is built against (torch_xla's release notes: one
#: exact torch per torch_xla release; torch_xla 2.8.1 still pairs with torch 2.8.0). Installing
#: xla-plugins pins the newest pair (its ``pyproject.toml``); older pairs run when installed together.
TORCH_FOR_TORCH_XLA: dict[tuple[int, ...], str] = {(2, 8): "2.8.0", (2, 9): "2.9.0"}


def version_mismatch(torch_xla: Version, torch: Version) -> str | None:
    """Why ``torch`` cannot run with ``torch_xla``, with the command that fixes it; ``None`` if they pair.

    A series in :data:`TORCH_FOR_TORCH_XLA` needs exactly its torch release (local build tags such as
    ``+cu128`` aside); a newer, untested series needs at least the same ``major.minor`` release.
    """
    series = torch_xla.release[:2]
    wanted = TORCH_FOR_TORCH_XLA.get(series)
    if wanted is not None and Version(torch.base_version) != Version(wanted):
        needed = wanted
    elif wanted is None and torch.release[:2] != series:
        needed = f"{series[0]}.{series[1]}.*"
    else:
        return None
    return (
        f"torch_xla {torch_xla} is built against torch {needed}, but torch {torch} is installed;"
        f" install the matching pair: pip install 'torch=={needed}' 'torch_xla=={torch_xla}'"
    )


@functools.lru_cache(maxsize=1)
def _check_versions(installed: Version) -> None:
    """Refuse a torch_xla too old for this plugin or built for another torch; warn outside the tested range.

    Lightning's supported range is xla-plugins' own declared dependency (its ``pyproject.toml``);
    torch and torch_xla must form a pair of :func:`version_mismatch`.

    Raises:
        RuntimeError: torch_xla is older than :data:`MIN_TORCH_XLA`, or it is built against another
            torch release than the installed one (the message gives the ``pip install`` that fixes it).
    """
    from trainer_plugins import unsupported_versions

    if installed.release[:2] < MIN_TORCH_XLA.release[:2]:
        raise RuntimeError(f"torch_xla {installed} is too old for the XLA plugin; it needs torch_xla>={MIN_TORCH_XLA}.")
    mismatch = version_mismatch(installed, Version(version("torch")))
    if mismatch is not None:
        raise RuntimeError(mismatch + ".")
    if installed.release[:2] not in TORCH_FOR_TORCH_XLA:
        log.warning("torch_xla %s is newer than the XLA plugin was tested with; it may not work.", installed)
    for message in unsupported_versions("xla-plugins", ["lightning"]):
        log.warning("%s; it may not work.", message)


#: How torch_xla announces, on import, the PJRT device it picked when PJRT_DEVICE is unset.
_TORCH_XLA_DEFAULT_NOTICES = (
    "Defaulting to PJRT_DEVICE=",
    "libtpu.so and TPU device found.",
    "Found libneuronpjrt.so.",
)


@contextlib.contextmanager
def _default_device_notice_left_to_us() -> Iterator[None]:
    """Drop torch_xla's own notice of its default PJRT device while it is imported.

    ``import torch_xla`` logs its choice through the root logger (``logging.warning``), which also
    installs a root handler as a side effect (``logging.basicConfig``), so every later log record
    of the process is printed a second time in the root format. :func:`_log_default_device` says
    the same once, with the hint to set ``PJRT_DEVICE``; this keeps the root logger as it was.
    """
    root = logging.getLogger()
    placeholder = logging.NullHandler() if not root.handlers else None
    if placeholder is not None:
        root.addHandler(placeholder)  # `logging.warning` configures the root logger only when it has no handler

    def keep(record: logging.LogRecord) -> bool:
        return not (record.name == "root" and record.getMessage().startswith(_TORCH_XLA_DEFAULT_NOTICES))

    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)
        if placeholder is not None:
            root.removeHandler(placeholder)


@functools.cache
def _log_default_device(device_type: str) -> None:
    """Say once per process which PJRT device torch_xla chose because ``PJRT_DEVICE`` is unset."""
    reason = " because no TPU was found" if device_type == "CPU" else ""
    log.warning(
        "PJRT_DEVICE is not set: torch_xla uses its %s device%s. Set PJRT_DEVICE (TPU, CUDA, CPU, ...) to choose.",
        device_type,
        reason,
    )


def device_type() -> str:
    """The active PJRT device type (``"TPU"``, ``"CPU"``, ``"CUDA"``, ...); imports torch_xla."""
    require_torch_xla()
    import torch_xla.runtime as xr

    return str(xr.device_type())


def device_count() -> int:
    """Number of devices of this host for the active PJRT device type, as the PJRT runtime reports it.

    The devices one process drives on this host (``addressable_runtime_device_count``): Lightning's
    ``devices`` flag counts the devices of one node, and on one host they are all the devices.
    Taken from :func:`runtime_figures`, so a started runtime is not needed (see there).

    Raises:
        ModuleNotFoundError, RuntimeError: see :func:`require_torch_xla`; also ``RuntimeError``
            when the PJRT device cannot be started (the message quotes the runtime's error) or does
            not answer within :data:`PROBE_TIMEOUT_S` seconds.
    """
    return runtime_figures().addressable_device_count


def _runtime_configuration() -> tuple[tuple[str, str], ...]:
    keys = ("PJRT_", "TPU_", "XLA_USE_SPMD", "CUDA_VISIBLE_DEVICES")
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(keys) or k.endswith("_NUM_DEVICES")))


@functools.lru_cache(maxsize=8)
def _probed_figures(configuration: tuple[tuple[str, str], ...]) -> RuntimeFigures:
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_report_figures, args=(sender,), daemon=True)
    child.start()
    sender.close()
    pjrt_device = os.environ.get("PJRT_DEVICE")
    try:
        if not receiver.poll(PROBE_TIMEOUT_S):
            raise RuntimeError(
                f"The PJRT runtime (PJRT_DEVICE={pjrt_device}) did not report its devices within"
                f" {PROBE_TIMEOUT_S:.0f} s; check that the device is attached and not used by another process."
            )
        ok, answer = receiver.recv()
    except EOFError:
        child.join(5)
        raise RuntimeError(
            f"The PJRT runtime (PJRT_DEVICE={pjrt_device}) crashed while starting (exit code {child.exitcode})."
        ) from None
    finally:
        receiver.close()
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
    if not ok:
        raise RuntimeError(
            f"PJRT_DEVICE={pjrt_device} is not usable here: {answer.rstrip('.')}."
            " Set PJRT_DEVICE to an attached device type (TPU, CUDA, CPU, ...)."
        )
    return RuntimeFigures(**answer)


def _report_figures(sender: Connection) -> None:
    # runs in the forked child: start the runtime, report, and leave without running exit handlers
    try:
        sender.send((True, _read_figures().__dict__))
    except BaseException as error:  # noqa: BLE001 - everything is reported to the parent
        sender.send((False, runtime_error_text(error)))
    finally:
        sender.close()
        os._exit(0)


_STACK_TRACE = re.compile(r"\*\*\* Begin stack trace \*\*\*.*?\*\*\* End stack trace \*\*\*", re.DOTALL)


@dataclass(frozen=True)
class RuntimeFigures:
    """What ``torch_xla.runtime`` reports about this process's (and replica thread's) place in the job.

    The strategies and the XLA environment take world sizes and ranks from these figures only
    (:mod:`xla_plugins.strategies._world` turns them into Lightning's), read through
    :func:`runtime_figures`, the one adapter between the plugin and torch_xla's process and device
    queries. Each field names the ``torch_xla.runtime`` function it comes from.

    Attributes:
        process_count: processes in the job across all hosts (``process_count()``).
        process_index: this process's index in ``[0, process_count)`` (``process_index()``).
        local_process_count: processes on this host (``local_process_count()``: one per TPU chip
            under ``xmp.spawn``, 1 for an SPMD run or on PJRT CPU).
        global_device_count: devices across all hosts (``global_runtime_device_count()``, which
            counts physical devices also in SPMD mode, where ``global_device_count()`` is 1).
        addressable_device_count: devices this process drives (``addressable_runtime_device_count()``).
        global_ordinal: this replica thread's ordinal across all hosts (``global_ordinal()``; 0 in
            SPMD mode, where one process drives the virtual device).
        local_ordinal: this replica thread's ordinal on its host (``local_ordinal()``).
    """

    process_count: int
    process_index: int
    local_process_count: int
    global_device_count: int
    addressable_device_count: int
    global_ordinal: int = 0
    local_ordinal: int = 0


#: The test double's figures source while :func:`simulated_runtime` is active (``None``: torch_xla's).
_figures_source: Optional[Callable[[], RuntimeFigures]] = None


def runtime_figures() -> RuntimeFigures:
    """This process's :class:`RuntimeFigures`, read from ``torch_xla.runtime``; inside
    :func:`simulated_runtime`, the simulated figures instead.

    The figures need a started runtime, and starting one in the main process would lock TPU chips
    and forbid ``xmp.spawn`` later. So unless this process already runs the runtime, they are read
    in a short-lived forked child process (ordinals 0) and cached per runtime configuration
    (``PJRT_*``, ``TPU_*``, ``*_NUM_DEVICES`` variables).

    Raises:
        ModuleNotFoundError, RuntimeError: see :func:`require_torch_xla`; also ``RuntimeError`` when
            the PJRT device cannot be started (the message quotes the runtime's error) or does not
            answer within :data:`PROBE_TIMEOUT_S` seconds.
    """
    if _figures_source is not None:
        return _figures_source()
    torch_xla = require_torch_xla()
    if torch_xla._XLAC._xla_runtime_is_initialized():
        return _read_figures()
    return _probed_figures(_runtime_configuration())


def _read_figures() -> RuntimeFigures:
    import torch_xla.runtime as xr

    return RuntimeFigures(
        process_count=xr.process_count(),
        process_index=xr.process_index(),
        local_process_count=xr.local_process_count(),
        global_device_count=xr.global_runtime_device_count(),
        addressable_device_count=xr.addressable_runtime_device_count(),
        global_ordinal=xr.global_ordinal(),
        local_ordinal=xr.local_ordinal(),
    )


@contextlib.contextmanager
def simulated_runtime(source: Callable[[], RuntimeFigures]) -> Iterator[None]:
    """Make :func:`runtime_figures` return ``source()``: the test double for a multi-host slice.

    No TPU pod is needed to test what the strategies do on one: inside this context every world
    size, rank and data share the plugin computes comes from ``source`` (called on every read, so it
    may answer per thread). torch_xla itself is not touched: devices, graphs and collectives stay
    real. Nested use restores the outer source on exit.

    Args:
        source: a callable returning the simulated :class:`RuntimeFigures`.
    """
    global _figures_source
    outer, _figures_source = _figures_source, source
    try:
        yield
    finally:
        _figures_source = outer


def runtime_error_text(error: BaseException) -> str:
    """``"<ExceptionType>: <message>"`` on one line, for quoting a torch_xla error to a user.

    torch_xla 2.8 appends a C++ stack trace (between ``*** Begin stack trace ***`` and
    ``*** End stack trace ***``) to the message of a failed runtime check; it is dropped and the
    remaining lines are joined, so the runtime's own reason (e.g. ``Unknown PJRT_DEVICE 'X'``) stays.
    """
    text = " ".join(_STACK_TRACE.sub(" ", str(error)).split())
    return f"{type(error).__name__}: {text}"


def auto_candidate() -> bool:
    """Whether ``accelerator="auto"`` should choose XLA, without starting a runtime.

    True when torch_xla is installed and an XLA-only device is selected and attached, or attached
    while ``PJRT_DEVICE`` is unset: a TPU (libtpu installed and torch_xla's probe finds a chip) or,
    for ``PJRT_DEVICE=CUDA``, a CUDA device. A CPU-only machine never imports torch_xla here.

    When ``PJRT_DEVICE`` is set (or empty) but names no device attached here, ``"auto"`` does not
    choose XLA (plain Lightning would run on the CPU; so do we) and one ``UserWarning`` names
    ``PJRT_DEVICE``; an explicit ``accelerator="tpu"`` still reports the runtime's own error.
    """
    if not importable("torch_xla"):
        return False
    raw = os.environ.get("PJRT_DEVICE")
    if raw is None:
        return _tpu_attached()
    selected = raw.strip().upper()
    if selected == "CPU":
        return False
    attached = _ATTACHED.get(selected)
    if attached is not None and attached():
        return True
    what = (
        "is empty"
        if not selected
        else f"names {'no device type torch_xla knows' if attached is None else 'a device type not attached here'}"
    )
    warnings.warn(
        f"PJRT_DEVICE={raw!r} {what}, so accelerator='auto' does not choose XLA and the run uses another"
        " accelerator (the CPU if nothing else is attached). Set PJRT_DEVICE to an attached device type"
        " (TPU, CUDA, CPU) or unset it; accelerator='tpu' reports the runtime's own error.",
        UserWarning,
        stacklevel=2,
    )
    return False


def _tpu_attached() -> bool:
    """libtpu is installed and torch_xla's PCI probe finds a TPU chip (starts no runtime)."""
    if not importable("libtpu"):
        return False
    from torch_xla._internal import tpu

    return tpu.num_available_chips() > 0


def _cuda_attached() -> bool:
    """torch sees a CUDA device (starts no XLA runtime)."""
    import torch

    return torch.cuda.device_count() > 0


#: Device types whose presence can be checked without starting a runtime.
_ATTACHED = {"TPU": _tpu_attached, "CUDA": _cuda_attached, "GPU": _cuda_attached}


def describe() -> dict[str, object]:
    """What ``trainer-plugins doctor`` shows for XLA: versions, PJRT device, device count, runtime.

    Starts the PJRT runtime (in a probe process) to count devices; failures are reported as values.
    """
    from trainer_plugins import unsupported_versions

    info: dict[str, object] = {
        "torch": _version_or("torch"),
        "torch_xla": _version_or("torch_xla"),
        "PJRT_DEVICE": _pjrt_device_shown(),
    }
    for number, problem in enumerate(unsupported_versions("xla-plugins", ["lightning"]), start=1):
        info[f"unsupported version {number}"] = problem
    raw = os.environ.get("PJRT_DEVICE")
    if raw is not None and not raw.strip():
        info["error"] = "PJRT_DEVICE is set but empty, so torch_xla starts no device; unset it or name a device type"
        return info
    try:
        info["runtime"] = "PJRT" if require_torch_xla() is not None else "?"
        info["device type"] = device_type()
        figures = runtime_figures()
    except (ModuleNotFoundError, RuntimeError) as error:
        info["error"] = runtime_error_text(error)
        return info
    info["device count"] = figures.addressable_device_count
    info.update(host_view(figures))
    for number, warning in enumerate(host_warnings(figures), start=1):
        info[f"warning {number}"] = warning
    return info


#: Distributions whose versions must be the same on every host of a slice (``doctor`` shows them).
SLICE_DISTRIBUTIONS = ("torch", "torch_xla", "libtpu", "lightning", "trainer-plugins", "xla-plugins")


def host_view(figures: RuntimeFigures) -> dict[str, object]:
    """The runtime's view of this host for ``doctor``: host index and count, local and global devices.

    A host is one process of a one-process-per-host run (how ``doctor``'s probe and the SPMD
    strategies start the runtime): host index ``process_index()``, host count ``process_count()``,
    local devices ``addressable_runtime_device_count()``, global ``global_runtime_device_count()``.
    """
    return {
        "host index": figures.process_index,
        "host count": figures.process_count,
        "local device count": figures.addressable_device_count,
        "global device count": figures.global_device_count,
    }


def host_warnings(figures: RuntimeFigures) -> list[str]:
    """What could differ between the hosts of a slice, as far as this host can see (``doctor``).

    Nothing on one host. On several: ``PJRT_DEVICE`` unset (each host then picks its own device,
    :func:`require_torch_xla`); the versions of :data:`SLICE_DISTRIBUTIONS`, which must match on
    every host and can only be compared across the hosts' outputs; devices that do not add up
    (``global != hosts x local``: hosts with different device counts).
    """
    if figures.process_count <= 1:
        return []
    warnings_ = []
    if not os.environ.get("PJRT_DEVICE", "").strip():
        warnings_.append(
            "PJRT_DEVICE is not set: each host picks its own device type (TPU only where libtpu finds a chip);"
            " set PJRT_DEVICE=TPU on every host"
        )
    versions = ", ".join(f"{name} {_version_or(name)}" for name in SLICE_DISTRIBUTIONS)
    warnings_.append(
        f"{figures.process_count} hosts: every host must run the same versions ({versions}) and environment;"
        " compare this output across hosts (run it with --worker=all)"
    )
    if figures.global_device_count != figures.process_count * figures.addressable_device_count:
        warnings_.append(
            f"{figures.global_device_count} global devices are not {figures.process_count} hosts x"
            f" {figures.addressable_device_count} local devices: the hosts have different device counts"
        )
    return warnings_


def _pjrt_device_shown() -> str:
    """``PJRT_DEVICE`` as ``doctor`` shows it: the value, or what its absence or emptiness means."""
    raw = os.environ.get("PJRT_DEVICE")
    if raw is None:
        return "(unset: torch_xla picks a TPU if attached, else CPU)"
    return raw if raw.strip() else "'' (set but empty)"


def _version_or(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


#: torch_xla versions whose PJRT CPU client hangs in cross-thread collectives (reference: docs/testing.md).
_CPU_COLLECTIVES_FIXED_IN = Version("2.10")
#: Test switch: ``1`` lets the one-worker-per-device strategy run on PJRT CPU although its collectives
#: would hang with this torch_xla. Only for a process that re-lowered the collectives itself, as the
#: project's test harness (``tests/xla_cpu_harness.py``) does; documented in docs/testing.md.
CPU_SPAWN_TEST_SWITCH = "XLA_PLUGINS_TEST_CPU_SPAWN"


def spawn_collectives_hang() -> bool:
    """Whether the one-worker-per-device strategy's collectives would hang on the active PJRT device.

    On PJRT CPU, torch_xla runs one thread per device, and torch_xla < 2.10 lowers ``all_reduce``,
    ``all_gather`` and ``reduce_scatter`` without a channel id; each thread compiles its own module,
    so the threads never meet in the rendezvous and XLA aborts. The test switch
    :data:`CPU_SPAWN_TEST_SWITCH` set to ``1`` declares that this process replaced those collectives
    (the test harness does); any other value, or none, leaves the refusal on.
    """
    if device_type() != "CPU":
        return False
    installed = torch_xla_version()
    if installed is None or installed >= _CPU_COLLECTIVES_FIXED_IN:
        return False
    return os.environ.get(CPU_SPAWN_TEST_SWITCH) != "1"

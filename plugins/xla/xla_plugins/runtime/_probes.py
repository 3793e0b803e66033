"""The runtime adapter: torch_xla's presence, version and PJRT checks, and the runtime's figures.

Every XLA role checks torch_xla through :func:`require_torch_xla`, and reads the process and device
figures of ``torch_xla.runtime`` through :func:`runtime_figures`, the one adapter over those
queries (a test replaces them with :func:`xla_plugins.testing.simulated_runtime`). Importing this
module imports neither torch nor torch_xla; each function imports torch_xla only when it has to.
"""

from __future__ import annotations

import functools
import importlib.util
import multiprocessing
import os
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import TYPE_CHECKING

from packaging.version import Version

from xla_plugins import testing
from xla_plugins._logging import default_device_notice_left_to_us, log, log_default_device
from xla_plugins.runtime import _torch_xla_contract
from xla_plugins.runtime._world import RuntimeFigures

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

#: Oldest torch_xla this plugin runs on (``torch_xla.device``/``torch_xla.sync``/``torch_xla.runtime``).
MIN_TORCH_XLA = Version("2.8")
#: Seconds the PJRT device probe may take (a TPU host needs a few seconds to start its client).
PROBE_TIMEOUT_S = 180.0
_INSTALL_HINT = "pip install 'xla-plugins' (which pulls torch_xla), or pip install 'torch_xla==<your torch version>'"


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
    with default_device_notice_left_to_us():
        import torch_xla
    import torch_xla.runtime as xr

    if xr.device_type() is None:
        raise RuntimeError(
            "The XLA XRT runtime is not supported anymore; set PJRT_DEVICE (TPU, CPU, CUDA, ...) to use PJRT."
        )
    if not chosen_by_user:
        _DEFAULTED_DEVICE.append(xr.device_type())
        log_default_device(xr.device_type())
    return torch_xla


#: The device type torch_xla chose itself because ``PJRT_DEVICE`` was unset (torch_xla then sets
#: ``PJRT_DEVICE`` in ``os.environ``, so the variable alone no longer tells); empty if the user chose.
_DEFAULTED_DEVICE: list[str] = []


def pjrt_device_defaulted() -> bool:
    """Whether torch_xla chose the PJRT device itself in this process (``PJRT_DEVICE`` was unset)."""
    return bool(_DEFAULTED_DEVICE)


#: The torch release each supported torch_xla series is built against (torch_xla's release notes: one
#: exact torch per torch_xla release; torch_xla 2.8.1 still pairs with torch 2.8.0). xla-plugins'
#: metadata admits both pairs and its extras ``xla29`` / ``xla28`` pin one (its ``pyproject.toml``).
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


def devices_usable() -> bool:
    """Whether torch_xla is installed and its active PJRT device has at least one device (never raises).

    The answer of ``XLAAccelerator.is_available()`` and ``XLAEnvironment.detect()``.
    """
    try:
        return device_count() > 0
    except (ModuleNotFoundError, RuntimeError):
        return False


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


def runtime_figures() -> RuntimeFigures:
    """This process's :class:`~xla_plugins.runtime._world.RuntimeFigures`, read from ``torch_xla.runtime``; inside
    :func:`xla_plugins.testing.simulated_runtime`, the simulated figures instead.

    The figures need a started runtime, and starting one in the main process would lock TPU chips
    and forbid ``xmp.spawn`` later. So unless this process already runs the runtime, they are read
    in a short-lived forked child process (ordinals 0) and cached per runtime configuration
    (``PJRT_*``, ``TPU_*``, ``*_NUM_DEVICES`` variables).

    Raises:
        ModuleNotFoundError, RuntimeError: see :func:`require_torch_xla`; also ``RuntimeError`` when
            the PJRT device cannot be started (the message quotes the runtime's error) or does not
            answer within :data:`PROBE_TIMEOUT_S` seconds.
    """
    simulated = testing.simulated_figures()
    if simulated is not None:
        return simulated
    require_torch_xla()
    if _torch_xla_contract.runtime_is_initialized():
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


def runtime_error_text(error: BaseException) -> str:
    """``"<ExceptionType>: <message>"`` on one line, for quoting a torch_xla error to a user.

    torch_xla 2.8 appends a C++ stack trace (between ``*** Begin stack trace ***`` and
    ``*** End stack trace ***``) to the message of a failed runtime check; it is dropped and the
    remaining lines are joined, so the runtime's own reason (e.g. ``Unknown PJRT_DEVICE 'X'``) stays.
    """
    text = " ".join(_STACK_TRACE.sub(" ", str(error)).split())
    return f"{type(error).__name__}: {text}"


#: torch_xla versions whose PJRT CPU client hangs in cross-thread collectives (reference: docs/testing.md).
_CPU_COLLECTIVES_FIXED_IN = Version("2.10")


def spawn_collectives_hang() -> bool:
    """Whether the one-worker-per-device strategy's collectives would hang on the active PJRT device.

    On PJRT CPU, torch_xla runs one thread per device, and torch_xla < 2.10 lowers ``all_reduce``,
    ``all_gather`` and ``reduce_scatter`` without a channel id; each thread compiles its own module,
    so the threads never meet in the rendezvous and XLA aborts. The test switch
    :data:`xla_plugins.testing.CPU_SPAWN_TEST_SWITCH` set to ``1`` declares that this process
    replaced those collectives (the test harness does); any other value, or none, leaves the refusal on.
    """
    if device_type() != "CPU":
        return False
    installed = torch_xla_version()
    if installed is None or installed >= _CPU_COLLECTIVES_FIXED_IN:
        return False
    return not testing.cpu_spawn_switched_on()

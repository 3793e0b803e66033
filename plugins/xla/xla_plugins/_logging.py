"""The plugin's logger, and torch_xla's default-device notice kept off the root logger.

``import torch_xla`` with ``PJRT_DEVICE`` unset logs the device it picked through the root logger
(``logging.warning``), which also installs a root handler (``logging.basicConfig``) as a side
effect. :func:`default_device_notice_left_to_us` keeps the root logger as it was while torch_xla is
imported; :func:`log_default_device` says the same once, on this plugin's logger, with the hint to
set ``PJRT_DEVICE``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator

log = logging.getLogger("xla_plugins")

#: How torch_xla announces, on import, the PJRT device it picked when PJRT_DEVICE is unset.
_TORCH_XLA_DEFAULT_NOTICES = (
    "Defaulting to PJRT_DEVICE=",
    "libtpu.so and TPU device found.",
    "Found libneuronpjrt.so.",
)


@contextlib.contextmanager
def default_device_notice_left_to_us() -> Iterator[None]:
    """Drop torch_xla's own notice of its default PJRT device while it is imported.

    Every later log record of the process would otherwise be printed a second time, in the root
    format, by the root handler torch_xla's notice installs.
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
def log_default_device(device_type: str) -> None:
    """Say once per process which PJRT device torch_xla chose because ``PJRT_DEVICE`` is unset."""
    reason = " because no TPU was found" if device_type == "CPU" else ""
    log.warning(
        "PJRT_DEVICE is not set: torch_xla uses its %s device%s. Set PJRT_DEVICE (TPU, CUDA, CPU, ...) to choose.",
        device_type,
        reason,
    )

"""torch's backend autoload entry point (group ``torch.backends``), run at every ``import torch``.

It reads one environment variable, :data:`VARIABLE`, and does nothing else unless it is set: no
import, no registration. ``TORCHTPU_PLUGINS_DEVICE=cpu`` installs the CPU-backed stand-in of the
``"tpu"`` device (:func:`torchtpu_plugins.standin.install`) while torch loads its backends, the moment
at which TorchTPU itself registers the device. Any other non-empty value raises ``ValueError``
naming the valid ones; torch then reports the backend extension as failed to load.
"""

from __future__ import annotations

import os

#: The environment variable that switches the stand-in on; read when torch loads its backends.
VARIABLE = "TORCHTPU_PLUGINS_DEVICE"
#: Its valid values: ``cpu`` (the stand-in device, memory in host RAM).
VALUES = ("cpu",)


def load() -> None:
    """Install the stand-in device if :data:`VARIABLE` asks for it; otherwise do nothing.

    Raises:
        ValueError: :data:`VARIABLE` holds a value other than those of :data:`VALUES`.
        RuntimeError: another backend already holds PrivateUse1 (raised by ``install``).
    """
    value = os.environ.get(VARIABLE, "")
    if not value:
        return
    if value not in VALUES:
        raise ValueError(f"{VARIABLE}={value!r} is not a valid value; valid values: {', '.join(VALUES)} (or unset)")
    from torchtpu_plugins.standin import install

    install()

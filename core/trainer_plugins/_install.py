"""Attaching trainer-plugins from code: :func:`install`, :func:`uninstall`, :func:`installed`.

:func:`install` does from code what the start-up hook (``_trainer_plugins_autoload``) does at
interpreter start: it watches for Lightning's import and attaches (:mod:`trainer_plugins._attach`).
"""

from __future__ import annotations

import _trainer_plugins_autoload as _autoload
from trainer_plugins._attach import attach, attached, detach


def install() -> None:
    """Make ``lightning.Trainer`` and ``lightning.Fabric`` ask the plugins (imports Lightning; idempotent).

    ``pytorch_lightning.Trainer`` and ``lightning_fabric.Fabric`` are attached too: now if imported,
    else when they are imported. This is what the start-up hook does automatically unless
    ``TRAINER_PLUGINS_AUTOLOAD=0``.

    Raises:
        ControlError: a control variable (``TRAINER_PLUGINS_*``) holds an unreadable value; nothing
            is attached, so Trainers built afterwards are Lightning's own.
    """
    from trainer_plugins._controls import Controls

    Controls.from_env()  # an unreadable control fails here, once, not in every Trainer
    import lightning  # noqa: F401 - loads the Trainer and Fabric modules

    _autoload.watch()
    attach()


def uninstall() -> None:
    """Give every Lightning Trainer and Fabric back Lightning's own connectors (and stop watching imports)."""
    _autoload.unwatch()
    detach()


def installed() -> bool:
    """Whether the imported Lightning packages' Trainer and Fabric build the plugin-aware connectors."""
    return attached()

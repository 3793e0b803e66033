"""The plugin's ``XLA_PLUGINS_*`` environment variables read into checked values, by the core's readers.

The readers moved to :mod:`trainer_plugins._variables` with the long-run settings they serve; this
name stays so that modules importing ``xla_plugins._variables`` keep working.
"""

from __future__ import annotations

from trainer_plugins._variables import choice_from_environment, seconds_from_environment

__all__ = ["choice_from_environment", "seconds_from_environment"]

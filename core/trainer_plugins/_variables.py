"""Reading the plugins' own environment variables (``TRAINER_PLUGINS_*`` and a backend plugin's) into checked values.

Environment variables are the one source of these settings: worker processes inherit them. Each
setting's variable is named and documented where it is used (the replica watch, the metric reads).
"""

from __future__ import annotations

import math
import os


def seconds_from_environment(variable: str, default: float, meaning: str) -> float:
    """Seconds (a finite number >= 0) from environment variable ``variable``; ``default`` when unset or blank.

    Args:
        variable: name of the environment variable, e.g. ``TRAINER_PLUGINS_CHECKPOINT_DEADLINE``.
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


def choice_from_environment(variable: str, choices: tuple[str, ...], default: str) -> str:
    """One of ``choices`` from environment variable ``variable`` (any case, blanks ignored); ``default`` if unset/blank.

    Args:
        variable: name of the environment variable, e.g. ``TRAINER_PLUGINS_RESUME``.
        choices: the valid values, lower case.
        default: the value when the variable is unset or blank (one of ``choices``).

    Raises:
        ValueError: any other value; the message names the variable, its value and the choices.
    """
    text = os.environ.get(variable, "")
    value = text.strip().lower() or default
    if value not in choices:
        raise ValueError(f"{variable}={text!r} is not valid: give one of {', '.join(choices)}.")
    return value


def process_count_from_environment(variable: str, default: int) -> int:
    """A count of processes (an integer >= 1) from environment variable ``variable``; ``default`` when unset.

    For the counts a launcher gives each process it starts (torchrun's ``LOCAL_WORLD_SIZE``, srun's
    ``SLURM_NTASKS_PER_NODE``). A variable set to a blank is not a count.

    Args:
        variable: name of the environment variable.
        default: the count returned when the variable is unset.

    Raises:
        ValueError: the value is not an integer >= 1; the message names the variable and its value.
    """
    text = os.environ.get(variable)
    if text is None:
        return default
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{variable}={text!r} is not a process count: valid are integers >= 1.")
    return int(text)

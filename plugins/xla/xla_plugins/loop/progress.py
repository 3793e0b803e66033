"""A TQDM progress bar that refreshes by the clock, for XLA devices.

Lightning's ``TQDMProgressBar`` redraws after every batch (``refresh_rate=1``) and asks for the
progress-bar metrics each time. On an XLA device a short step lasts about a millisecond, so redrawing
every step costs a noticeable share of it, and nobody reads a bar that changes a thousand times a
second. :class:`XLAProgressBar` draws the same bar at most every ``interval_s`` seconds (and at the
last batch), which is also when it asks for the metrics, so the lazy metric reads of
:mod:`xla_plugins.loop.metrics` happen at the same cadence.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from lightning.pytorch.callbacks import TQDMProgressBar

from xla_plugins.loop import metrics


class XLAProgressBar(TQDMProgressBar):
    """Lightning's TQDM progress bar, redrawn at most every ``interval_s`` seconds and at each last batch.

    The XLA accelerator gives Lightning's default bar this class at the start of a run (see
    :func:`install`); pass one yourself to choose the interval.

    Args:
        interval_s: shortest time between two redraws, in seconds; ``None``: the metric read
            interval (``XLA_PLUGINS_METRIC_READ_INTERVAL``, default 0.5).
        process_position, leave: as for ``TQDMProgressBar``.

    Raises:
        ValueError: ``interval_s`` is negative, or ``XLA_PLUGINS_METRIC_READ_INTERVAL`` is invalid.
    """

    _interval_s: float
    _last_redraw: float

    def __init__(self, interval_s: Optional[float] = None, process_position: int = 0, leave: bool = False) -> None:
        super().__init__(refresh_rate=1, process_position=process_position, leave=leave)
        self._start(interval_s)

    def _start(self, interval_s: Optional[float] = None) -> None:
        if interval_s is not None and not interval_s >= 0:
            raise ValueError(f"`interval_s` must be a number of seconds >= 0, got {interval_s!r}.")
        self._interval_s = metrics.read_interval_s() if interval_s is None else float(interval_s)
        self._last_redraw = float("-inf")

    def _should_update(self, current: int, total: Any) -> bool:
        if not super()._should_update(current, total):
            return False
        now = time.monotonic()
        if current == total or now - self._last_redraw >= self._interval_s:
            self._last_redraw = now
            return True
        return False


def install(trainer: Any) -> bool:
    """Give ``trainer``'s progress bar the class :class:`XLAProgressBar` if it is Lightning's default one.

    "Default" means exactly ``TQDMProgressBar`` redrawing every batch (``refresh_rate=1``), as Lightning
    adds it when no progress bar is given. Its object stays the same (a reference the user holds
    keeps working); any other progress bar, a subclass included, is left alone. Nothing changes when
    the read policy is ``eager`` (``XLA_PLUGINS_METRIC_READS=eager``).

    Returns:
        Whether the progress bar was changed.
    """
    bar = getattr(trainer, "progress_bar_callback", None)
    if metrics.read_policy() == "eager" or type(bar) is not TQDMProgressBar or bar.refresh_rate != 1:
        return False
    bar.__class__ = XLAProgressBar
    assert isinstance(bar, XLAProgressBar)
    bar._start()
    return True

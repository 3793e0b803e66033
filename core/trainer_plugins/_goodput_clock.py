"""The goodput ledger's clock: wall time charged to one bucket at a time, compile seconds taken out of it.

Pure (no Lightning): ``trainer_plugins._goodput`` tells the clock where the run's boundaries are.

**Charging.** The clock keeps a stack of buckets; the top one is *current*. At every boundary
(:meth:`BucketClock.charge`, which :meth:`~BucketClock.begin`, :meth:`~BucketClock.end` and
:meth:`~BucketClock.set_base` call first), the wall time since the previous boundary
(``time.monotonic``) goes to the current bucket, except the compile seconds the backend's
``compile_seconds`` reader counted in the meantime, which go to ``"compilation"``. So every second
between the clock's start and its last boundary is in exactly one bucket, and the buckets add up
to the elapsed time (to float rounding). Compile seconds taken from one interval never exceed the
interval: a process-wide figure that counts several threads' compilations (replica threads of one
process) is capped there.

**Nesting.** The bottom of the stack is the *base* bucket (start-up, productive steps, teardown:
:meth:`~BucketClock.set_base`). An interval begun inside another takes over only if its bucket
ranks higher (:data:`RANKS`): a checkpoint saved during validation is checkpoint time, a batch
fetched during validation stays validation time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Optional

#: How the buckets of intervals rank when one begins inside another (the base buckets rank 0).
RANKS = {"data": 1, "validation": 2, "checkpoint_save": 3, "checkpoint_restore": 3}


class BucketClock:
    """Charges wall time to the current bucket of ``seconds`` and compile seconds to ``seconds["compilation"]``.

    Args:
        seconds: the attempt's seconds per bucket (changed in place; see :meth:`rebind`).
        compile_seconds: the backend's compile seconds so far (a process-wide total, in s), or ``None``.
        started: ``time.monotonic()`` value of the clock's start (the attempt's start).
        compiled_at_start: the value of ``compile_seconds()`` at ``started`` (0.0 at the start of a process).
        base: the base bucket at the start.
    """

    def __init__(
        self,
        seconds: dict[str, float],
        compile_seconds: Optional[Callable[[], float]],
        started: float,
        compiled_at_start: float = 0.0,
        base: str = "startup",
    ) -> None:
        self.seconds = seconds
        self._compile_seconds = compile_seconds
        self._mark, self._compiled = started, compiled_at_start
        #: (bucket, key of the interval that pushed it); the bottom one is the base
        self._stack: list[tuple[str, Optional[str]]] = [(base, None)]

    @property
    def current(self) -> str:
        """The bucket the time goes to now."""
        return self._stack[-1][0]

    @property
    def base(self) -> str:
        """The base bucket (the bottom of the stack)."""
        return self._stack[0][0]

    def compiled(self) -> float:
        """The backend's compile seconds so far (0.0 without a reader)."""
        return self._compile_seconds() if self._compile_seconds is not None else 0.0

    def charge(self) -> float:
        """Give the time since the last boundary to the current bucket (its compile seconds to compilation).

        Returns:
            ``time.monotonic()`` now, the new boundary.
        """
        now, compiled = time.monotonic(), self.compiled()
        elapsed = max(now - self._mark, 0.0)
        compiling = min(max(compiled - self._compiled, 0.0), elapsed)
        self.seconds[self.current] += elapsed - compiling
        self.seconds["compilation"] += compiling
        self._mark, self._compiled = now, compiled
        return now

    def begin(self, bucket: str, key: Optional[str] = None) -> bool:
        """An interval of ``bucket`` begins; it ends at :meth:`end` with the same ``key`` (default: ``bucket``).

        Returns:
            Whether it took over (its bucket ranks higher than the current one's).
        """
        self.charge()
        if RANKS.get(bucket, 0) <= RANKS.get(self.current, 0):
            return False
        self._stack.append((bucket, key or bucket))
        return True

    def end(self, key: str) -> bool:
        """The interval ``key`` ends: if it is the current one, the time goes back to the one below.

        Returns:
            Whether it was the current interval.
        """
        if self._stack[-1][1] != key:
            return False
        self.charge()
        self._stack.pop()
        return True

    def set_base(self, bucket: str) -> None:
        """From now on the base bucket is ``bucket`` (intervals begun on top of it stay)."""
        self.charge()
        self._stack[0] = (bucket, None)

    def reset(self, base: str) -> None:
        """Leave every interval (the loop was left by an exception); the base bucket is ``base`` from now on."""
        self.charge()
        self._stack = [(base, None)]

    def rebind(self, seconds: dict[str, float]) -> None:
        """Charge into ``seconds`` from now on, after adding what was charged so far (a new account object)."""
        self.charge()
        for name, value in self.seconds.items():
            seconds[name] = seconds.get(name, 0.0) + value
        self.seconds = seconds


def process_start(pid: Optional[int] = None) -> Optional[float]:
    """The ``time.monotonic()`` value at which process ``pid`` (default: this one) started; ``None`` if unknown.

    Read on Linux from ``/proc/<pid>/stat`` (field 22, the start in clock ticks after boot) and the
    clock ``CLOCK_BOOTTIME`` (both count from the boot, with suspended time); 10 ms resolution
    (``SC_CLK_TCK`` = 100). Elsewhere ``None``.
    """
    try:
        with open(f"/proc/{pid or os.getpid()}/stat", "rb") as stream:
            text = stream.read().decode()
        ticks = int(text[text.rindex(")") + 2 :].split()[19])  # fields after the command name start at field 3
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.monotonic() - max(age, 0.0)

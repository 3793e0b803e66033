"""Reading logged metrics on XLA: at the readers' own cadence, all pending values in one transfer.

Lightning turns every value logged with ``prog_bar=True`` into a Python number each time it
collects metrics (``_ResultCollection.metrics``, at the end of every batch and again for the
progress bar), and its logger connector calls ``.item()`` once per logged metric. On an XLA device
each of those reads is a device-to-host transfer that waits for the device, so a default script
(``self.log(..., prog_bar=True)`` every step) stalls the device once or twice a step.

:func:`install` (called by the XLA accelerator at the start of every run) changes only *when*
values are read, never what they are:

* progress-bar values logged on step are read at most every :data:`DEFAULT_READ_INTERVAL_S`
  seconds (or ``XLA_PLUGINS_METRIC_READ_INTERVAL``), and at once when a name has no value read
  yet; between reads the progress bar shows the latest value read;
* epoch-end values (``on_epoch=True`` results, and the last on-step value of each progress-bar
  metric) are read exactly when the epoch ends, once, and reused until they change;
* a logger's read (every ``log_every_n_steps`` and at epoch end) fetches all its tensors at once;
* every read fetches all pending tensors in one transfer (torch_xla's ``xla_model._maybe_convert_to_cpu``);
* a logged name's result, when its tensors already live on the value's device, is not moved
  again at each ``self.log`` (Lightning's move walks all of its attributes, a sizeable share of a
  short step: see docs/performance.md);
* results reset between epochs start from device data uploaded from the CPU
  (``xm.send_cpu_data_to_device``), so the first step of each later epoch runs the graph of every
  other step instead of compiling a new one.

Progress bars, loggers and callbacks, the user's own included, see the same keys and number types
as in plain Lightning. ``XLA_PLUGINS_METRIC_READS=eager`` switches all of this off (Lightning reads
every value when it collects it).
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import torch
from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector
from lightning.pytorch.trainer.connectors.logger_connector.result import _METRICS, _ResultCollection, _ResultMetric
from lightning_utilities import apply_to_collection
from torch import Tensor

from trainer_plugins import _variables
from xla_plugins.runtime import _torch_xla_contract

#: Variable that selects the read policy: ``lazy`` (default) or ``eager`` (Lightning's own reads).
READS_VARIABLE = "XLA_PLUGINS_METRIC_READS"
#: Variable that sets the shortest time between two on-step progress-bar reads, in seconds.
INTERVAL_VARIABLE = "XLA_PLUGINS_METRIC_READ_INTERVAL"
#: Shortest time between two on-step progress-bar reads, in seconds: at most two reads a second.
DEFAULT_READ_INTERVAL_S = 0.5
_POLICIES = ("lazy", "eager")


def read_policy() -> str:
    """The read policy from ``XLA_PLUGINS_METRIC_READS``: ``"lazy"`` (default, also when empty) or ``"eager"``.

    Raises:
        ValueError: any other value; the message names it and the valid choices.
    """
    policy = os.environ.get(READS_VARIABLE, "").strip().lower() or "lazy"
    if policy not in _POLICIES:
        raise ValueError(f"{READS_VARIABLE}={os.environ[READS_VARIABLE]!r} is not valid; choose one of {_POLICIES}.")
    return policy


def read_interval_s() -> float:
    """Seconds between on-step progress-bar reads, from ``XLA_PLUGINS_METRIC_READ_INTERVAL`` (default 0.5).

    Raises:
        ValueError: the value is not a number >= 0; the message names it.
    """
    return _variables.seconds_from_environment(
        INTERVAL_VARIABLE, DEFAULT_READ_INTERVAL_S, "the seconds between two reads of the progress-bar metrics"
    )


def fetch(data: Any) -> Any:
    """``data`` (any collection) with its XLA tensors copied to the CPU in one device-to-host transfer.

    Pending computations of those tensors run first, as for any read. Non-XLA values are returned as
    they are.
    """
    tensors: list[Tensor] = []
    apply_to_collection(data, Tensor, lambda tensor: tensors.append(tensor) if tensor.device.type == "xla" else None)
    if not tensors:
        return data
    copies = dict(zip(map(id, tensors), _torch_xla_contract.convert_to_cpu(tensors), strict=True))
    return apply_to_collection(data, Tensor, lambda tensor: copies.get(id(tensor), tensor))


def _computed(tensor: Tensor) -> bool:
    """Whether the XLA ``tensor`` holds device data (its graph has run), so that reading it runs no graph."""
    # torch_xla has no public test for this; its tensor description says "XLAData: None" while the
    # tensor is only a pending computation (asking for the data handle crashes on SPMD data instead).
    return "XLAData: None" not in _torch_xla_contract.tensor_debug_info(tensor)


def _upload(tensor: Tensor, device: Any) -> Tensor:
    """``tensor`` copied to the XLA ``device`` as device data.

    ``tensor.to(device)`` would not do for a scalar 0 or 1: torch_xla turns those into constants of
    the graph that uses them, which makes that graph differ from the one that gets a computed value.
    """
    import torch_xla.core.xla_model as xm

    return xm.send_cpu_data_to_device([tensor], device)[0]


class _ResultMetricInPlace(_ResultMetric):
    """Lightning's result of one logged name, whose ``to(device)`` returns at once when nothing is elsewhere.

    Lightning's ``_ResultCollection.log`` calls ``to(value.device)`` on the result at every
    ``self.log``, which moves every tensor among the result's attributes with ``apply_to_collection``
    (deep-copying its metadata dataclass on the way). On XLA the value lives on the same device
    step after step, so the walk moves nothing.
    """

    def to(self, *args: Any, **kwargs: Any) -> _ResultMetric:  # type: ignore[override]  # as Lightning's
        if len(args) == 1 and not kwargs and isinstance(args[0], torch.device) and self._all_on(args[0]):
            return self
        return super().to(*args, **kwargs)

    def _all_on(self, device: torch.device) -> bool:
        """Whether every tensor Lightning's ``to`` would move is on ``device``; ``False`` for a logged ``Metric``."""
        return self.is_tensor and all(tensor.device == device for tensor in self._tensors())

    def _tensors(self) -> list[Tensor]:
        """The tensors of a tensor result: its states, their defaults, its step and epoch values.

        These are all the tensors among its attributes; tests/test_metric_reads.py checks that
        against Lightning's own walk for each supported Lightning version.
        """
        names = (*self._defaults, "_forward_cache", "_computed")
        held = [*self._defaults.values(), *(self.__dict__.get(name) for name in names)]
        return [value for value in held if isinstance(value, Tensor)]


class _LazyResultCollection(_ResultCollection):
    """Lightning's result collection, reading progress-bar values at most every ``_read_interval_s``.

    Set as the class of the loops' existing collections by :func:`install`; ``_read_interval_s``,
    ``_shown`` and ``_cpu_defaults`` are set there too.
    """

    _read_interval_s: float
    _last_read: float
    #: progress-bar name -> (tensor read, its value)
    _shown: dict[str, tuple[Tensor, float]]
    #: result key -> state name -> the state's default, on the CPU
    _cpu_defaults: dict[str, dict[str, Tensor]]

    def _start(self) -> None:
        """Set the read state of a collection that has just become lazy; its results become in place."""
        self._last_read, self._shown, self._cpu_defaults = float("-inf"), {}, {}
        for result in self.values():
            _in_place(result)

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, _in_place(value))

    def metrics(self, on_step: bool) -> _METRICS:
        """The callback, logger and progress-bar metrics, as Lightning's; progress-bar values from :meth:`_read`."""
        collected = _METRICS(callback={}, log={}, pbar={})
        wanted: dict[str, Tensor] = {}
        for _, result in self.valid_items():
            value = self._get_cache(result, on_step)
            if not on_step and result.meta.on_step and result.meta.prog_bar and result._forward_cache is not None:
                # the epoch has ended: the last on-step value is shown exactly, too
                wanted[self._forked_name(result, True)[1]] = result._forward_cache
            if not isinstance(value, Tensor):
                continue
            name, forked_name = self._forked_name(result, on_step)
            if result.meta.logger:
                collected["log"][forked_name] = value
            if self.training or (result.meta.on_epoch and not on_step):
                collected["callback"][name] = value
                collected["callback"][forked_name] = value
            if result.meta.prog_bar:
                wanted[forked_name] = result._forward_cache if on_step else result._computed
        collected["pbar"].update(self._read(wanted, exact=not on_step))
        return collected

    def _read(self, wanted: dict[str, Tensor], exact: bool) -> dict[str, float]:
        """Numbers for ``wanted`` (name -> tensor): cached, or read in one transfer when a read is due.

        A read is due when ``exact`` (epoch end), when a name has no value yet, or when
        ``_read_interval_s`` has passed since the last read. Only tensors not read before are fetched,
        and, unless ``exact``, only those already computed: reading a tensor of a graph still pending
        (a batch that accumulates gradients, a value logged after the step) would run part of the
        step's graph on its own, a graph of its own to compile.
        """
        if not wanted:
            return {}
        pending = {name: tensor for name, tensor in wanted.items() if self._shown.get(name, (None,))[0] is not tensor}
        now = time.monotonic()
        due = exact or any(name not in self._shown for name in wanted) or now - self._last_read >= self._read_interval_s
        if pending and due and not exact:
            pending = {name: tensor for name, tensor in pending.items() if _computed(tensor)}
        if pending and due:
            values = fetch(list(pending.values()))
            for (name, tensor), value in zip(pending.items(), values, strict=True):
                self._shown[name] = (tensor, value.item())
            self._last_read = now
        return {name: self._shown[name][1] for name in wanted if name in self._shown}

    def reset(self, metrics: Optional[bool] = None, fx: Optional[str] = None) -> None:
        """Reset as Lightning does, then put each reset tensor state on the device as uploaded data.

        Lightning's reset clones the state's default on the device, which leaves a pending clone in
        the next step's graph: a graph unlike the first epoch's, compiled again. An uploaded value is
        plain device data, as in the first epoch.
        """
        super().reset(metrics, fx)
        reset = {key: result for key, result in self.items() if result.is_tensor and result.has_reset}
        missing = {key: result._defaults for key, result in reset.items() if key not in self._cpu_defaults}
        if missing:
            self._cpu_defaults.update(fetch(missing))
        for key, result in reset.items():
            for state, default in self._cpu_defaults[key].items():
                device = getattr(result, state).device
                if device.type == "xla":
                    setattr(result, state, _upload(default, device))

    def cpu(self) -> _ResultCollection:
        """Move every tensor state to the CPU, the XLA ones in one transfer, then as Lightning does."""
        states = {
            key: {name: value for name, value in vars(result).items() if isinstance(value, Tensor)}
            for key, result in self.items()
            if result.is_tensor
        }
        for key, moved in fetch(states).items():
            for name, value in moved.items():
                setattr(self[key], name, value)
        self._shown.clear()
        return super().cpu()


def _in_place(result: Any) -> Any:
    """``result`` with the class :class:`_ResultMetricInPlace` if it is exactly Lightning's ``_ResultMetric``."""
    if type(result) is _ResultMetric:
        result.__class__ = _ResultMetricInPlace
    return result


class _LazyLoggerConnector(_LoggerConnector):
    """Lightning's logger connector, fetching every tensor of a logger call in one transfer."""

    def log_metrics(self, metrics: Any, step: Optional[int] = None) -> None:
        if self.trainer.loggers and metrics:
            metrics = fetch(metrics)
        super().log_metrics(metrics, step=step)

    def teardown(self) -> None:
        """Move the metrics kept for the user to the CPU in one transfer, then as Lightning does."""
        self._logged_metrics, self._progress_bar_metrics, self._callback_metrics = fetch(
            (self._logged_metrics, self._progress_bar_metrics, self._callback_metrics)
        )
        super().teardown()


def _collections(trainer: Any) -> list[_ResultCollection]:
    loops = (
        trainer.fit_loop.epoch_loop,
        trainer.fit_loop.epoch_loop.val_loop,
        trainer.validate_loop,
        trainer.test_loop,
    )
    return [loop._results for loop in loops if isinstance(getattr(loop, "_results", None), _ResultCollection)]


def install(trainer: Any) -> bool:
    """Make ``trainer`` read logged metrics lazily (see the module docstring), unless the policy is ``eager``.

    Idempotent. Changes the classes of the trainer's result collections and logger connector to
    subclasses of Lightning's that read differently and otherwise behave the same.

    Args:
        trainer: a ``lightning.pytorch.Trainer``.

    Returns:
        Whether the lazy reads are active.

    Raises:
        ValueError: ``XLA_PLUGINS_METRIC_READS`` or ``XLA_PLUGINS_METRIC_READ_INTERVAL`` is invalid.
    """
    if read_policy() == "eager":
        return False
    interval = read_interval_s()
    for results in _collections(trainer):
        if not isinstance(results, _LazyResultCollection):
            results.__class__ = _LazyResultCollection
        assert isinstance(results, _LazyResultCollection)
        if not hasattr(results, "_shown"):
            results._start()
        results._read_interval_s = interval
    connector = trainer._logger_connector
    if type(connector) is _LoggerConnector:
        connector.__class__ = _LazyLoggerConnector
    return True


__all__ = [
    "DEFAULT_READ_INTERVAL_S",
    "INTERVAL_VARIABLE",
    "READS_VARIABLE",
    "fetch",
    "install",
    "read_interval_s",
    "read_policy",
]

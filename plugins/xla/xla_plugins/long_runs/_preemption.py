"""The stop checkpoint (:mod:`trainer_plugins.long_runs._preemption`) on the Trainer's XLA strategies.

The core writes the checkpoint and decides when a signal stops the run; what torch_xla changes is
where the replicas agree on the stop (:mod:`~xla_plugins.long_runs._stop_agreement`):

* the spawn strategy (``"xla"``, one worker process per device, or one replica thread per device)
  runs Lightning's loop in replica threads, where Python takes no signal and Lightning installs no
  handler, and calls no ``on_exception`` there. Its replicas agree instead: a signal to the main
  process or to any worker fixes the batch after which all replicas of the host stop (up to
  ``STOP_MARGIN_BATCHES`` after the one in flight), each replica sets Lightning's stop flag when it
  starts that batch (or the first batch after it that ends an accumulation window), and the
  launcher writes the checkpoint from every replica
  (:func:`~trainer_plugins.long_runs._preemption.run_saving_on_stop`); on several hosts the
  replicas' worker processes agree over a group of their own;
* the hosts of a slice under the SPMD strategies (one process per host) agree over their process
  group (the strategy's ``hosts``), not ``torch.distributed``'s default group.

The settings' earlier names, ``XLA_PLUGINS_CHECKPOINT_SIGNALS``, ``XLA_PLUGINS_CHECKPOINT_DEADLINE`` and
``XLA_PLUGINS_RESUME``, stay accepted beside the core's ``TRAINER_PLUGINS_*`` ones
(:mod:`~xla_plugins.long_runs._stop_agreement` registers them).
"""

from __future__ import annotations

from typing import Optional

from trainer_plugins.long_runs import _preemption
from trainer_plugins.long_runs._preemption import run_saving_on_stop
from xla_plugins.long_runs import _stop_agreement
from xla_plugins.long_runs._stop_agreement import agreed_signal, several_hosts

__all__ = ["SavesCheckpointOnStop", "run_saving_on_stop"]


class SavesCheckpointOnStop(_preemption.SavesCheckpointOnStop):
    """The core's stop checkpoint, with the XLA strategies' agreement: the spawn strategy's replicas, or the hosts.

    Raises:
        ValueError: see :class:`trainer_plugins.long_runs._preemption.SavesCheckpointOnStop`.
    """

    _batches = 0
    _spawn_hosts: Optional[_stop_agreement.WorkerGroup] = None  # a spawn replica leading its process on several hosts
    _spawn_spans_hosts = False  # a spawn replica on several hosts

    def _stop_needs_agreement(self) -> bool:
        """Several hosts with one process each (the SPMD strategies): the hosts agree over their ``hosts`` group."""
        return several_hosts(self) and _stop_agreement.host_stop is None

    def _agreed_stop_signal(self, signum: Optional[int]) -> Optional[int]:
        return agreed_signal(self, signum)

    def _stops_in_replicas(self) -> bool:
        """A replica of the spawn strategy: the replicas agree at batch starts (:class:`_stop_agreement.HostStop`)."""
        self._batches = 0
        if _stop_agreement.host_stop is None:
            return False
        self._spawn_spans_hosts = self.num_nodes > 1  # type: ignore[attr-defined]
        if self._spawn_spans_hosts:
            _stop_agreement.host_stop.spans_hosts()
            self._spawn_hosts = _stop_agreement.spawn_hosts()
        return True

    def _stop_at_batch_start(self, stop: _preemption._Stop) -> None:
        """In a replica of the spawn strategy a stop is due from the agreed batch on (on several hosts the one
        the hosts agreed on); elsewhere the core's rule."""
        host_stop = _stop_agreement.host_stop
        if host_stop is None:
            super()._stop_at_batch_start(stop)
            return
        trainer = self.lightning_module.trainer
        self._batches += 1
        signum = host_stop.batch_started(self._batches, self._spawn_hosts, self._spawn_spans_hosts)
        if signum is not None and not self._inside_accumulation_window():
            stop.start(signum, f"the replicas stop after batch {self._batches}", announce=trainer.is_global_zero)
            trainer._signal_connector.received_sigterm = True  # Lightning's stop flag

    def _after_stop_checkpoint(self) -> None:
        if _stop_agreement.host_stop is not None:
            self.barrier("stop checkpoint renamed")  # type: ignore[attr-defined]  # no replica leaves before

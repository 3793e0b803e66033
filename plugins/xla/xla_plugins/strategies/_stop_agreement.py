"""The hosts of a slice agree on the batch after which they all stop (one process per host: the SPMD strategies).

A stop signal may reach one host only (a preemption notice of one VM, a scheduler's signal to one
process). Each host's Python runs the same steps in lock-step with the others, because every step's
program holds collectives across all hosts; a host that stopped alone would leave the others waiting
in the next one, or in the stop checkpoint's collectives. So with several hosts no host stops on its
own signal: at the start of every training batch the hosts reduce the signal each one has received
(``0`` for none) with a maximum over their gloo process group
(:class:`~xla_plugins.strategies._hosts.HostGroup`), and all see the same answer at the same batch:
they all stop after that batch (at the end of its accumulation window), and write the stop
checkpoint together. The cost is one all-reduce of one integer over the hosts' CPU group a training
batch, on several hosts only (on one host nothing runs). A signal therefore stops the run one batch
after the batch in flight when it arrived.
"""

from __future__ import annotations

from typing import Any, Optional


def several_hosts(strategy: Any) -> bool:
    """Whether ``strategy`` runs on several hosts with one process each (its ``hosts`` group spans more than one)."""
    hosts = getattr(strategy, "hosts", None)
    return bool(hosts is not None and hosts.several)


def agreed_signal(strategy: Any, signum: Optional[int]) -> Optional[int]:
    """The stop signal any host of ``strategy``'s run has received (the largest number), or ``None`` if none has.

    Every host must call it at the same point of the loop (a collective over the hosts' group).

    Args:
        strategy: a strategy with a ``hosts`` :class:`~xla_plugins.strategies._hosts.HostGroup`.
        signum: the signal this host received, or ``None``.
    """
    agreed = int(strategy.hosts.reduce(int(signum or 0), "max"))
    return agreed or None

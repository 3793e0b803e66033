"""What torch_xla adds to the core's long-run machinery (:mod:`trainer_plugins.long_runs`).

The stop checkpoint, exact continuation, atomic commits and the goodput ledger are the core's; this
folder keeps only what needs torch_xla:

* ``_preemption``: the stop checkpoint on the Trainer's XLA strategies;
* ``_stop_agreement``: where the replicas (or hosts) of a run agree on the batch after which they stop;
* ``_fabric_preemption``: Fabric's XLA strategies on a stop signal;
* ``_goodput``: the goodput ledger of each ``fit``, fed torch_xla's compile time.
"""

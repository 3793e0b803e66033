"""Checkpoints on XLA: the Checkpoint IO plugins and the sharded checkpoints of the SPMD strategies.

* :mod:`~xla_plugins.checkpoints.checkpoint_io`: atomic writes, and writes in a background thread
  (built on the core's :mod:`trainer_plugins.long_runs` commits);
* ``_state_copies``: the copies a save takes on the training thread (device or host);
* ``_sharded_writes``: the files of a sharded checkpoint; ``_sharded_checkpoints``: the strategies'
  side of them (each device's shards, nothing gathered);
* ``_background_checkpoints``: the strategy mixins that make the background writes the default.
"""

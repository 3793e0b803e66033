"""What the XLA accelerator changes in Lightning's Trainer loop so that a step does not wait for the device.

* :mod:`~xla_plugins.loop.closure`: the training step's loss without a division by one in every graph;
* :mod:`~xla_plugins.loop.metrics`: logged metrics read at the readers' cadence, in one transfer;
* :mod:`~xla_plugins.loop.progress`: a TQDM progress bar that refreshes by the clock.

Installed by :meth:`xla_plugins.roles.accelerator.XLAAccelerator.setup` for the Trainer only.
"""

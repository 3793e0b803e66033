"""The roles a Lightning run asks the plugin for, besides the strategies: accelerator, precision, launch environment.

* :mod:`~torchtpu_plugins.roles.accelerator`: ``accelerator="tpu" | "torchtpu"``, the ``"tpu"`` device
  counted through ``torch.accelerator``;
* :mod:`~torchtpu_plugins.roles.precision`: autocast and dtypes on ``"tpu"``;
* ``_launch_environment``: the TPU runtime's variables set before any worker starts (torch-tpu's
  ``set_tpu_launch_env`` where installed).

The cluster environments (TPU VM, GKE, SkyPilot, torchrun, srun, Ray) are the core's and Lightning's;
the strategies have their own folder (:mod:`torchtpu_plugins.strategies`), as in xla-plugins.
"""

"""The roles a Lightning run asks the plugin for, besides the strategies: accelerator, precision, cluster environment.

* :mod:`~xla_plugins.roles.accelerator`: ``accelerator="tpu" | "xla"`` (any PJRT device), with what
  it installs into the Trainer's loop (:mod:`xla_plugins.loop`) and its auto-detection (``_detection``);
* :mod:`~xla_plugins.roles.precision`: ``"32-true"``, ``"16-true"``, ``"bf16-true"`` on XLA;
* :mod:`~xla_plugins.roles.environment`: world size and ranks as the torch_xla runtime (or torchrun) reports them.

The fourth role, the strategies, has its own folder (:mod:`xla_plugins.strategies`). The hook
implementations that hand these classes to trainer-plugins are in ``xla_plugins._hooks``.
"""

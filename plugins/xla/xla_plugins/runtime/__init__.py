"""The torch_xla runtime as the plugin sees it: whether it is there and which version, its figures, its private names.

* ``_probes``: torch_xla's presence and version, the PJRT device, and the runtime's figures read in a
  child process so that the caller never starts the runtime;
* ``_world``: Lightning's world size and ranks from those figures;
* ``_torch_xla_contract``: every private torch_xla name the plugin relies on, checked by the tests;
* :mod:`~xla_plugins.runtime.device_module`: ``torch.xla``, the device module torch's device-generic code looks up;
* ``_silenced_warnings``: torch_xla's warnings from inside the plugin's own calls.

Nothing here imports a strategy, a role or Lightning's loop: every other folder builds on this one.
"""

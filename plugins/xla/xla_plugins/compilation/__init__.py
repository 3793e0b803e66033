"""XLA compilation: the compile monitor, its reports and budget, the persistent cache, the ``torch.compile`` backend.

* :mod:`~xla_plugins.compilation.compile_monitor`: compilations and host reads per phase of the
  Trainer's loop (a callback); :mod:`~xla_plugins.compilation.fabric_steps`: the same for a Fabric loop;
* :mod:`~xla_plugins.compilation.loop_phases`, :mod:`~xla_plugins.compilation.host_reads`: the
  phases and their counts, and the wrapped read methods;
* :mod:`~xla_plugins.compilation.compile_reports`: the texts of a late event and of the summary;
* :mod:`~xla_plugins.compilation.recompile_budget` (``XLA_PLUGINS_RECOMPILES``) and ``_compile_budget``
  (the strategies' ``recompiles=`` argument);
* :mod:`~xla_plugins.compilation.compile_cache`: torch_xla's persistent cache (``XLA_PLUGINS_COMPILE_CACHE``);
* ``_compile_backend``: which ``torch.compile`` backend a compiled LightningModule may use on XLA.
"""

"""Long runs, for every backend: the stop checkpoint, exact continuation, atomic checkpoint writes.

A backend plugin's Trainer strategies mix these in; each module names what a backend supplies:

* :mod:`~trainer_plugins.long_runs._preemption`: a stop signal (SIGTERM) ends the run with one
  checkpoint of the whole training state (the backend may supply the "any process stopping?"
  collective); settings in :mod:`~trainer_plugins.long_runs._stop_settings`; where the checkpoint
  lives and how ``ckpt_path="last"`` finds it in :mod:`~trainer_plugins.long_runs._stop_checkpoint`;
* :mod:`~trainer_plugins.long_runs._loader_position`, :mod:`~trainer_plugins.long_runs._rng_states`
  and :mod:`~trainer_plugins.long_runs._interrupted_validation`: a resumed fit continues exactly
  where its checkpoint was written (a backend seeds its own device generator);
* :mod:`~trainer_plugins.long_runs._commits`: a checkpoint, file or directory, appears only whole.

The goodput ledger, the other long-run concern, is in the core already (``trainer_plugins._goodput*``).
Nothing here imports a backend or names one; the submodules import Lightning and are imported on
demand (this package imports none of them).
"""

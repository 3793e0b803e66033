"""The private Lightning names the XLA plugin relies on (checked per Lightning version by the tests).

The core lists its own in ``trainer_plugins._lightning_contract``; these are the XLA roles' own:
Lightning's XLA launchers and their worker hand-over, the result collection and logger connector
whose reads :mod:`xla_plugins.loop.metrics` defers, the progress bar's redraw test, and a few private
helpers. ``tests/test_lightning_contract.py`` runs
``trainer_plugins._lightning_contract.contract_violations`` on them in every tox environment, for
``lightning`` and ``pytorch_lightning``, so a Lightning release that renames one fails the matrix
instead of changing the plugin's behaviour silently. Nothing here imports Lightning.
"""

from __future__ import annotations

from trainer_plugins._lightning_contract import PrivateAttribute, PrivateMethod

_RESULT = "lightning.pytorch.trainer.connectors.logger_connector.result"
_LOGGER = "lightning.pytorch.trainer.connectors.logger_connector.logger_connector:_LoggerConnector"
_LAUNCHER = "lightning.pytorch.strategies.launchers.xla:_XLALauncher"
_FABRIC_LAUNCHER = "lightning.fabric.strategies.launchers.xla:_XLALauncher"

METHODS = (
    # xla_plugins.loop.metrics
    PrivateMethod(f"{_RESULT}:_ResultCollection._get_cache", ("result_metric", "on_step")),
    PrivateMethod(f"{_RESULT}:_ResultCollection._forked_name", ("self", "result_metric", "on_step")),
    PrivateMethod(f"{_RESULT}:_ResultCollection.valid_items", ("self",)),
    PrivateMethod(f"{_RESULT}:_ResultCollection.metrics", ("self", "on_step")),
    PrivateMethod(f"{_RESULT}:_ResultCollection.reset", ("self", "metrics", "fx")),
    PrivateMethod(f"{_RESULT}:_ResultCollection.cpu", ("self",)),
    PrivateMethod(f"{_RESULT}:_ResultMetric.to", ("self", "args", "kwargs")),
    PrivateMethod(f"{_LOGGER}.log_metrics", ("self", "metrics", "step")),
    PrivateMethod(f"{_LOGGER}.teardown", ("self",)),
    # xla_plugins.loop.closure
    PrivateMethod(
        "lightning.pytorch.loops.optimization.automatic:ClosureResult.from_training_step_output",
        ("training_step_output", "normalize"),
    ),
    # xla_plugins.loop.progress
    PrivateMethod(
        "lightning.pytorch.callbacks.progress.tqdm_progress:TQDMProgressBar._should_update",
        ("self", "current", "total"),
    ),
    # xla_plugins.strategies.launchers.xla
    PrivateMethod(
        f"{_LAUNCHER}._wrapping_function",
        ("self", "process_idx", "trainer", "function", "args", "kwargs", "return_queue", "global_states"),
    ),
    PrivateMethod(f"{_LAUNCHER}._collect_rank_zero_results", ("self", "trainer", "results")),
    PrivateMethod(f"{_LAUNCHER}._recover_results_in_main_process", ("self", "worker_output", "trainer")),
    PrivateMethod(
        f"{_FABRIC_LAUNCHER}._wrapping_function",
        ("self", "process_idx", "function", "args", "kwargs", "return_queue", "global_states"),
    ),
    # the spawn strategy's launcher (the long-run pieces' private names are the core's contract)
    PrivateMethod("lightning.pytorch.strategies.strategy:Strategy._configure_launcher", ("self",)),
)

ATTRIBUTES = (
    # private module-level names imported by the plugin
    PrivateAttribute(f"{_RESULT}:", "_ResultCollection"),
    PrivateAttribute(f"{_RESULT}:", "_METRICS"),
    PrivateAttribute(f"{_RESULT}:", "_ResultMetric"),
    PrivateAttribute(_LOGGER.partition(":")[0] + ":", "_LoggerConnector"),
    PrivateAttribute("lightning.pytorch.strategies.launchers.xla:", "_XLALauncher"),
    PrivateAttribute("lightning.fabric.strategies.launchers.xla:", "_XLALauncher"),
    PrivateAttribute("lightning.pytorch.strategies.launchers.launcher:", "_Launcher"),
    PrivateAttribute("lightning.pytorch.strategies.launchers.multiprocessing:", "_WorkerOutput"),
    PrivateAttribute("lightning.pytorch.overrides.distributed:", "_IndexBatchSamplerWrapper"),
    PrivateAttribute("lightning.fabric.plugins.precision.utils:", "_convert_fp_tensor"),
    PrivateAttribute("lightning.fabric.utilities.optimizer:", "_optimizers_to_device"),
    PrivateAttribute("lightning.fabric.utilities.types:", "_DEVICE"),
    PrivateAttribute("lightning.fabric.utilities.types:", "_PATH"),
    PrivateAttribute("lightning.fabric.utilities.types:", "_Stateful"),
    # private instance attributes the plugin reads or replaces
    PrivateAttribute("lightning.pytorch.trainer.trainer:Trainer", "_logger_connector"),
    PrivateAttribute(_LOGGER, "_logged_metrics"),
    PrivateAttribute(_LOGGER, "_progress_bar_metrics"),
    PrivateAttribute(_LOGGER, "_callback_metrics"),
    PrivateAttribute("lightning.pytorch.loops.training_epoch_loop:_TrainingEpochLoop", "_results"),
    PrivateAttribute("lightning.pytorch.loops.evaluation_loop:_EvaluationLoop", "_results"),
    PrivateAttribute(f"{_RESULT}:_ResultMetric", "_forward_cache"),
    PrivateAttribute(f"{_RESULT}:_ResultMetric", "_computed"),
    PrivateAttribute(f"{_RESULT}:_ResultMetric", "_defaults"),
    PrivateAttribute("lightning.pytorch.loops.optimization.automatic:_AutomaticOptimization", "output_result_cls"),
    PrivateAttribute("lightning.pytorch.strategies.strategy:Strategy", "_launcher"),
    # xla_plugins.long_runs._preemption sets Lightning's stop flag in a replica of the spawn strategy (the core's
    # trainer_plugins.long_runs lists the rest of its names in trainer_plugins._lightning_contract)
    PrivateAttribute("lightning.pytorch.trainer.trainer:Trainer", "_signal_connector"),
    PrivateAttribute("lightning.pytorch.core.module:LightningModule", "_trainer"),
    PrivateAttribute("lightning.pytorch.trainer.connectors.signal_connector:_SignalConnector", "received_sigterm"),
)

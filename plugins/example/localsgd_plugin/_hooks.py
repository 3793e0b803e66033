"""Hook implementations of the Local SGD plugin; plain data, nothing heavy is imported."""

from trainer_plugins import StrategyEntry, hookimpl

TRAINER_PLUGINS_API = ">=1.0,<2"


@hookimpl
def trainer_plugins_strategies() -> list[StrategyEntry]:
    # Not declared distributed: the strategy's own `is_distributed` says when it is.
    return [
        StrategyEntry(
            "local_sgd", trainer="localsgd_plugin.strategy:LocalSGDStrategy", description="Local SGD on CPU processes"
        ),
        StrategyEntry(
            "local_sgd_8",
            trainer="localsgd_plugin.strategy:LocalSGDStrategy",
            description="Local SGD, averaging every 8 steps",
            init_kwargs={"sync_every": 8},
        ),
    ]

"""Running an evaluation's pending work when the evaluation ends."""

from __future__ import annotations


class RunsPendingEvaluationWork:
    """Mixin for the Trainer's XLA strategies: ``torch_xla.sync()`` when validation ends.

    Lightning's evaluation loop does not sync after each step. Whatever the evaluation computed and
    nobody read (metrics logged without ``prog_bar``, outputs a module keeps for later) would stay
    pending and join the graph of the next training step, a graph unlike every other step's, compiled
    again in a later epoch. Syncing here runs it as part of the evaluation's own graph.
    """

    def on_validation_end(self) -> None:
        import torch_xla

        torch_xla.sync()
        super().on_validation_end()  # type: ignore[misc]

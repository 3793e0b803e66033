"""The training step's loss on XLA: no division by one traced into every step's graph.

Lightning's automatic optimization divides the loss that ``training_step`` returns by
``accumulate_grad_batches`` (``ClosureResult.from_training_step_output``), also when that number is
1. On a CPU or GPU the division by 1 is one cheap kernel. On XLA every tensor operation is traced
into the step's graph: it adds a division and its constant to the forward pass and another pair to
the backward pass (4 of the small benchmark model's 61 graph nodes a step, counted by torch_xla's
``TensorsGraphSize`` metric), two more traced operations and a backward node, every step.

:func:`install` (called by the XLA accelerator at the start of every run) makes the training loop
build its closure results with :class:`ClosureResultOnXLA`, which clones the loss instead of dividing
it by 1: a new tensor with the same value and the same (identity) gradient, as the division makes,
but no node in the graph (torch_xla's clone shares the IR value). For any other
``accumulate_grad_batches``, and for outputs that are not a loss tensor or a dict with one,
Lightning's own method runs unchanged (its division and its errors).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loops.optimization.automatic import ClosureResult
from torch import Tensor


class ClosureResultOnXLA(ClosureResult):
    """Lightning's ``ClosureResult``, with the loss cloned instead of divided when ``normalize`` is 1."""

    @classmethod
    def from_training_step_output(cls, training_step_output: Any, normalize: int = 1) -> ClosureResult:
        """As Lightning's, but ``loss.clone()`` stands for ``loss / 1``.

        Args:
            training_step_output: what ``training_step`` returned: a loss tensor, a dict with a
                ``"loss"`` tensor and other keys (kept as ``extra``), or ``None`` (the step is skipped).
            normalize: ``accumulate_grad_batches``; the loss is divided by it (Lightning's method)
                unless it is 1.

        Raises:
            MisconfigurationException: as Lightning's (a dict without ``"loss"``, any other type).
        """
        if normalize == 1:
            if isinstance(training_step_output, Tensor):
                return cls(training_step_output.clone())
            if isinstance(training_step_output, Mapping) and isinstance(training_step_output.get("loss"), Tensor):
                extra = {key: value for key, value in training_step_output.items() if key != "loss"}
                return cls(training_step_output["loss"].clone(), extra=extra)
        return super().from_training_step_output(training_step_output, normalize)


def install(trainer: Any) -> None:
    """Make ``trainer``'s automatic optimization build :class:`ClosureResultOnXLA` (idempotent).

    Only this trainer's loop changes; a result class the loop already has that is not Lightning's
    own (set by the user or another plugin) is left as it is.

    Args:
        trainer: a ``lightning.pytorch.Trainer``.
    """
    optimization = trainer.fit_loop.epoch_loop.automatic_optimization
    if optimization.output_result_cls is ClosureResult:
        optimization.output_result_cls = ClosureResultOnXLA


__all__ = ["ClosureResultOnXLA", "install"]

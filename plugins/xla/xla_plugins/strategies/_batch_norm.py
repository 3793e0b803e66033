"""BatchNorm's running variance on XLA made PyTorch's: the unbiased batch variance, as on the CPU and CUDA.

PyTorch updates ``running_var`` of a training-mode ``_BatchNorm`` (``BatchNorm1d/2d/3d``,
``SyncBatchNorm`` when it does not synchronise, the lazy variants) with the *unbiased* variance of
the batch: ``running_var = (1 - f) * running_var + f * var_b * n / (n - 1)``, where ``n`` is the
number of values per channel (``input.numel() / input.size(1)``) and ``f`` the module's
``momentum`` (or ``1 / num_batches_tracked`` when ``momentum`` is ``None``). torch_xla 2.9's
lowering uses the *biased* variance ``var_b`` instead: ``BatchNorm1d(1, momentum=1)`` on
``[1, 2, 3, 4]`` leaves 1.25 where PyTorch leaves 1.6667. Running means, outputs and gradients
are PyTorch's.

:func:`running_var_update` finds out, once per process, which update the installed torch_xla
does (a probe on the device, not a version check: no torch_xla release is known to fix it, and a
fixed one then needs no correction). Where it is the biased one, :class:`BatchNormVarianceCorrection`
hooks every such module of a set-up model and, after each training-mode forward, adds what the
biased update left out::

    running_var += (running_var - (1 - f) * old) / (n - 1)

(``running_var - (1 - f) * old`` is ``f * var_b``, and ``f * var_b * n / (n - 1)`` is PyTorch's
term). The old value is a clone taken by a pre-hook; everything stays on the device and joins the
step's graph (no host reads, no graph of its own). :class:`CorrectsBatchNormAtSetup` (Trainer)
and :class:`CorrectsBatchNormWithModule` (Fabric) are the strategies' mixins.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch
from torch import Tensor
from torch.nn import Module
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.hooks import RemovableHandle

from xla_plugins._logging import log

#: What :func:`running_var_update` answers: torch_xla updates like PyTorch, with the biased
#: variance (corrected), or in some other way (not corrected, a warning says so).
UNBIASED, BIASED, UNKNOWN = "unbiased", "biased", "unknown"


@functools.cache
def running_var_update() -> str:
    """How this process's torch_xla updates ``running_var``: :data:`UNBIASED`, :data:`BIASED` or :data:`UNKNOWN`.

    Probes once per process: ``BatchNorm1d(1, momentum=1)`` in training mode on ``[1, 2, 3, 4]``
    on ``torch_xla.device()`` leaves 5/3 (PyTorch's unbiased variance) or 1.25 (the biased one).
    Costs one tiny graph and one read of one number.
    """
    import torch_xla

    probe = torch.nn.BatchNorm1d(1, momentum=1.0, affine=False).to(torch_xla.device())
    with torch.no_grad():
        probe(torch.tensor([[1.0], [2.0], [3.0], [4.0]], device=torch_xla.device()))
    value = float(probe.running_var.cpu()[0])  # type: ignore[union-attr]
    if abs(value - 5.0 / 3.0) < 1e-4:
        return UNBIASED
    if abs(value - 1.25) < 1e-4:
        return BIASED
    return UNKNOWN


def _updates_running_stats(module: Module) -> bool:
    return isinstance(module, _BatchNorm) and module.track_running_stats and module.running_var is not None


class BatchNormVarianceCorrection:
    """Forward hooks on a model's ``_BatchNorm`` modules that give ``running_var`` PyTorch's unbiased update.

    A module is corrected on a forward in training mode, with ``track_running_stats``, on an XLA
    input; otherwise its hooks do nothing (evaluation, a module moved back to the CPU). Modules
    added to the model after :meth:`attach` are not hooked.
    """

    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []
        self._hooked: set[int] = set()
        self._old: dict[int, Tensor] = {}

    def attach(self, model: Module) -> list[str]:
        """Hook ``model``'s ``_BatchNorm`` modules that track running statistics, where torch_xla needs it.

        Returns the names of the hooked modules (none when torch_xla updates as PyTorch does, or
        when the model has none; then nothing is probed either). Logs the hooked modules' names;
        warns, naming the modules, when torch_xla's update is neither PyTorch's nor the known biased
        one (and hooks nothing).
        """
        found = [(name, m) for name, m in model.named_modules() if _updates_running_stats(m)]
        if not found:
            return []
        update = running_var_update()
        names = [name or type(m).__name__ for name, m in found]
        if update == UNKNOWN:
            log.warning(
                "torch_xla updates BatchNorm's running_var neither as PyTorch does nor with the biased variance:"
                " running_var of %s will differ from the CPU's, and trainer-plugins does not correct it.",
                ", ".join(names),
            )
        if update != BIASED:
            return []
        for _, module in found:
            if id(module) in self._hooked:
                continue
            self._hooked.add(id(module))
            self._handles.append(module.register_forward_pre_hook(self._keep_old))
            self._handles.append(module.register_forward_hook(self._correct))
        log.info("trainer-plugins: correcting torch_xla's biased BatchNorm running_var update of %s", ", ".join(names))
        return names

    def detach(self) -> None:
        """Remove every hook (the modules update as torch_xla does again)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._hooked.clear()
        self._old.clear()

    def _keep_old(self, module: _BatchNorm, args: tuple[Any, ...]) -> None:
        if module.training and _updates_running_stats(module) and _xla_input(args):
            self._old[id(module)] = module.running_var.detach().clone()  # type: ignore[union-attr]

    def _correct(self, module: _BatchNorm, args: tuple[Any, ...], output: Any) -> None:
        old = self._old.pop(id(module), None)
        if old is None:
            return
        factor = _averaging_factor(module)
        if factor is None:
            return
        values = args[0]
        count = values.numel() // values.size(1)  # > 1: PyTorch refuses one value per channel in training
        # Through `.data`: the forward saved running_var for its backward, so an in-place change of the
        # tensor itself would fail that backward (version check); the backward of a training-mode
        # batch norm does not read it.
        running_var = module.running_var.data  # type: ignore[union-attr]
        running_var.add_((running_var - old * (1 - factor)) / (count - 1))


def _xla_input(args: tuple[Any, ...]) -> bool:
    return bool(args) and isinstance(args[0], Tensor) and args[0].device.type == "xla"


def _averaging_factor(module: _BatchNorm) -> Optional[Any]:
    """The ``exponential_average_factor`` of ``_BatchNorm.forward``: ``momentum``, or ``1 / num_batches_tracked``.

    With ``momentum=None`` it is a device tensor (PyTorch reads it as a number; here it stays on the device).
    """
    if module.momentum is not None:
        return module.momentum
    if module.num_batches_tracked is None:
        return None  # PyTorch's factor is 0: running_var does not change
    return 1.0 / module.num_batches_tracked


class _HoldsBatchNormCorrection:
    """The strategy's :class:`BatchNormVarianceCorrection`; its hooks are removed at ``teardown``."""

    def teardown(self) -> None:
        self._batch_norm_correction().detach()
        super().teardown()  # type: ignore[misc]

    def _batch_norm_correction(self) -> BatchNormVarianceCorrection:
        return self.__dict__.setdefault("_batch_norm_hooks", BatchNormVarianceCorrection())


class CorrectsBatchNormAtSetup(_HoldsBatchNormCorrection):
    """Mixin for Trainer strategies: hook the model's BatchNorm modules when training starts; unhook at ``teardown``.

    Training starts (Lightning's ``Strategy.on_train_start``) after the model is set up and
    restored, in every worker, and before the first training-mode forward of ``fit`` (validation
    and the sanity check run in evaluation mode: nothing to correct). See
    :class:`BatchNormVarianceCorrection`.
    """

    model: Optional[Module]

    def on_train_start(self) -> None:
        super().on_train_start()  # type: ignore[misc]
        if self.model is not None:
            self._batch_norm_correction().attach(self.model)


class CorrectsBatchNormWithModule(_HoldsBatchNormCorrection):
    """Mixin for Fabric strategies: hook the BatchNorm modules of each module set up (``setup_module``).

    Fabric never calls its strategy's ``teardown``, so the hooks stay with the set-up module; they
    act only on training-mode forwards of XLA inputs (see :class:`BatchNormVarianceCorrection`).
    """

    def setup_module(self, module: Module) -> Module:
        module = super().setup_module(module)  # type: ignore[misc]
        self._batch_norm_correction().attach(module)
        return module

"""The XLA precision plugin: true 32/16/bf16 precision, no mixed precision (AMP) on XLA."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Any, Optional, Protocol

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.precision.utils import _convert_fp_tensor
from lightning.fabric.plugins.precision.xla import XLAPrecision as _LightningFabricXLAPrecision
from lightning.fabric.utilities.rank_zero import rank_zero_deprecation, rank_zero_warn
from lightning.fabric.utilities.types import Optimizable
from lightning.pytorch.plugins.precision.xla import XLAPrecision as _LightningXLAPrecision
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning_utilities import apply_to_collection
from torch import Tensor
from torch.nn import Module
from typing_extensions import override

from xla_plugins.runtime import _probes

#: Precision string -> dtype of parameters and activations.
PRECISIONS: dict[str, torch.dtype] = {
    "32-true": torch.float32,
    "16-true": torch.float16,
    "bf16-true": torch.bfloat16,
}
#: torch_xla's environment variables that change the dtypes a run computes in. ``XLA_USE_BF16``
#: makes every float32 tensor bfloat16 on the device; ``XLA_DOWNCAST_BF16`` keeps float32 tensors but
#: computes them in bfloat16. torch_xla >= 2.6 deprecates both. This plugin never sets nor removes them.
USER_PRECISION_VARIABLES = ("XLA_USE_BF16", "XLA_DOWNCAST_BF16")
#: Lightning's spellings of "32-true" that mean exactly the same thing.
_ALIASES: dict[Any, str] = {32: "32-true", "32": "32-true"}


def check_precision(precision: Any) -> str:
    """The XLA precision string for ``precision``.

    Args:
        precision: ``"32-true"`` (or Lightning's alias ``32``/``"32"``), ``"16-true"`` or ``"bf16-true"``.

    Raises:
        ValueError: anything else (``16``, ``"16-mixed"``, ``"bf16-mixed"``, ``"64-true"``, ...), naming
            the value and listing the three accepted ones. XLA has no mixed precision (AMP).
    """
    name = _ALIASES.get(precision, precision) if isinstance(precision, (int, str)) else precision
    if isinstance(name, str) and name in PRECISIONS:
        return name
    raise ValueError(
        f"`precision={precision!r}` is not supported on XLA. Choose one of"
        f" {', '.join(repr(p) for p in PRECISIONS)}; XLA has no mixed precision (AMP)."
    )


class _SharedDefaultDtype:
    """``torch.set_default_dtype`` for the replicas of one process, which run as threads.

    The default dtype is process-wide, and a worker driving several XLA devices runs one replica per
    thread, all in the same precision. The first replica to enter sets the dtype, the last to leave
    restores the one found on entry, so no replica ever sees another's half-restored state.
    """

    _lock = threading.Lock()
    _depth = 0
    _saved: torch.dtype = torch.float32

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __enter__(self) -> None:
        with _SharedDefaultDtype._lock:
            if _SharedDefaultDtype._depth == 0:
                _SharedDefaultDtype._saved = torch.get_default_dtype()
                torch.set_default_dtype(self.dtype)
            _SharedDefaultDtype._depth += 1

    def __exit__(self, *exc_info: Any) -> None:
        with _SharedDefaultDtype._lock:
            _SharedDefaultDtype._depth -= 1
            if _SharedDefaultDtype._depth == 0:
                torch.set_default_dtype(_SharedDefaultDtype._saved)


_warned_variables: set[str] = set()
_warned_lock = threading.Lock()


def warn_about_user_precision_variables() -> list[str]:
    """Warn once per process for each of :data:`USER_PRECISION_VARIABLES` set in the environment.

    Such a variable comes from the user's environment (this plugin never sets one): torch_xla reads
    it when its runtime starts and then computes float32 tensors in bfloat16, so a ``"32-true"``
    run's math changes silently, and torch_xla's Pallas kernels refuse to run under ``XLA_USE_BF16``.
    The variable is left as it was found. Returns the names of the variables set (``"0"`` and empty
    values count as unset).
    """
    found = [name for name in USER_PRECISION_VARIABLES if os.environ.get(name, "0").strip() not in ("", "0")]
    for name in found:
        with _warned_lock:
            if name in _warned_variables:
                continue
            _warned_variables.add(name)
        rank_zero_warn(
            f"The environment sets {name}={os.environ[name]}: torch_xla then computes float32 tensors in bfloat16,"
            " whatever `precision` says (a '32-true' run does not compute in float32), and deprecates the variable"
            f" since 2.6. xla-plugins leaves it as it is; unset {name} and choose precision='bf16-true' for bfloat16."
        )
    return found


class _XLAPrecisionBehaviour:
    """What the Trainer and Fabric flavours share: dtype handling, and no precision variable.

    The module, the tensors created in it and floating-point inputs are converted to the dtype of
    the precision, so training really runs in it. Unlike Lightning's own ``XLAPrecision``, which
    sets ``XLA_USE_F16=1``/``XLA_USE_BF16=1`` when built and deletes both at teardown (a user's
    own variable included), this plugin sets no variable: every torch_xla it supports (>= 2.8)
    deprecates ``XLA_USE_BF16`` and never reads ``XLA_USE_F16``, the dtype conversion does the work,
    and a set ``XLA_USE_BF16`` would be inherited by child processes and make torch_xla's Pallas
    kernels (``torch_xla.experimental.custom_kernel``) refuse to run. A user's own precision
    variables are left as they were found, with a warning (:func:`warn_about_user_precision_variables`).
    """

    precision: str
    _desired_dtype: torch.dtype

    def __init__(self, precision: Any = "32-true") -> None:
        _probes.require_torch_xla()
        self.precision = check_precision(precision)
        self._desired_dtype = PRECISIONS[self.precision]
        self._forward_dtype = _SharedDefaultDtype(self._desired_dtype)  # reused: its state is the class's
        warn_about_user_precision_variables()

    def convert_module(self, module: Module) -> Module:
        """Cast ``module``'s parameters and buffers to the precision's dtype."""
        return module if self._desired_dtype == torch.float32 else module.to(dtype=self._desired_dtype)

    def tensor_init_context(self) -> AbstractContextManager:
        return _SharedDefaultDtype(self._desired_dtype)

    def module_init_context(self) -> AbstractContextManager:
        return self.tensor_init_context()

    def forward_context(self) -> AbstractContextManager:
        """Create new floating-point tensors in the precision's dtype during forward.

        One context manager made once, not a generator around a new one: this is on every step's path.
        """
        return self._forward_dtype

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point tensors of ``data`` (any collection) to the precision's dtype."""
        return apply_to_collection(data, function=_convert_fp_tensor, dtype=Tensor, dst_type=self._desired_dtype)

    def convert_output(self, data: Any) -> Any:
        """Cast floating-point tensors of ``data`` back to float32."""
        return apply_to_collection(data, function=_convert_fp_tensor, dtype=Tensor, dst_type=torch.float32)

    def teardown(self) -> None:
        """Nothing to undo: no environment variable was set (a user's own are left as they are)."""


class XLAPrecision(_XLAPrecisionBehaviour, _LightningXLAPrecision):  # type: ignore[misc]
    """Precision plugin of ``lightning.Trainer`` on XLA: ``"32-true"``, ``"16-true"``, ``"bf16-true"``.

    Subclasses Lightning's ``XLAPrecision`` (which Lightning's XLA strategies require) but sets no
    ``XLA_USE_*`` variable and leaves the user's as they are (see ``_XLAPrecisionBehaviour``).

    Args:
        precision: see :func:`check_precision`.

    Raises:
        ValueError: unsupported precision (see :func:`check_precision`).
        ModuleNotFoundError: torch_xla is not installed.
    """

    @override
    def optimizer_step(  # type: ignore[override]
        self, optimizer: Optimizable, model: pl.LightningModule, closure: Callable[[], Any], **kwargs: Any
    ) -> Any:
        """Step inside the closure, reducing gradients across replicas (``xm.reduce_gradients``), then sync the graph.

        Raises:
            MisconfigurationException: ``training_step`` returned ``None`` under automatic
                optimization; skipping backward is not supported on XLA.
        """
        import torch_xla

        closure = partial(self._xla_wrap_closure, optimizer, closure)
        closure = partial(self._wrap_closure, model, optimizer, closure)
        closure_result = optimizer.step(closure=closure, **kwargs)
        # Under manual optimization this runs inside `training_step`, where a profiler (Lightning's
        # XLAProfiler: torch_xla.debug.profiler.Trace) may hold a scope open; resetting the IR scopes
        # then fails ("Expecting scope to be empty", Lightning #20206). The scope closes with the hook.
        torch_xla.sync(reset_scope=model.automatic_optimization)
        if model.automatic_optimization and closure_result is None:
            raise MisconfigurationException(
                "`training_step` returned None, which skips backward. Skipping backward is not supported on XLA"
                " with automatic optimization: return the loss, or use manual optimization"
                " (`self.automatic_optimization = False`)."
            )
        return closure_result


class FabricXLAPrecision(_XLAPrecisionBehaviour, _LightningFabricXLAPrecision):  # type: ignore[misc]
    """Precision plugin of ``lightning.Fabric`` on XLA: ``"32-true"``, ``"16-true"``, ``"bf16-true"``.

    Its optimizer step is Lightning's: ``xm.optimizer_step(optimizer, barrier=True)``, which reduces
    the gradients across replicas, steps, and syncs the graph right away (better for performance).
    As the Trainer's, it sets no ``XLA_USE_*`` variable. Fabric calls it at every forward of a set-up
    module and every ``optimizer.step()``: it tells :attr:`step_boundaries` (the compile monitor of
    :mod:`xla_plugins.compilation.fabric_steps`, when one is installed) where each starts and ends. It leaves
    ``backward`` to Lightning: Fabric takes a precision plugin that overrides it as one that needs
    ``fabric.backward(loss)``, and would refuse ``loss.backward()``.

    Raises:
        ValueError: unsupported precision (see :func:`check_precision`).
        ModuleNotFoundError: torch_xla is not installed.
    """

    #: the Fabric compile monitor watching the steps (``compilation.fabric_steps.FabricCompileMonitor``), or None
    step_boundaries: Optional[FabricStepBoundaries] = None

    def convert_input(self, data: Any) -> Any:
        if self.step_boundaries is not None:
            self.step_boundaries.forward_called(data)
        return super().convert_input(data)

    @contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        with _phase(self.step_boundaries, "forward"), super().forward_context():
            yield

    def optimizer_step(self, optimizer: Optimizable, **kwargs: Any) -> Any:
        boundaries = self.step_boundaries
        with _phase(boundaries, "optimizer_step"):
            result = super().optimizer_step(optimizer, **kwargs)
        if boundaries is not None:
            boundaries.optimizer_stepped()
        return result


class FabricStepBoundaries(Protocol):
    """What :class:`FabricXLAPrecision` tells of a Fabric loop's steps (``xla_plugins.compilation.fabric_steps``)."""

    def forward_called(self, data: Any) -> None:
        """A set-up module's forward is called with ``data`` (its ``(args, kwargs)``)."""

    def enter(self, action: str) -> None:
        """A phase starts: ``"[Fabric]forward"`` or ``"[Fabric]optimizer_step"``."""

    def leave(self, action: str) -> None:
        """The phase ``action`` ends."""

    def optimizer_stepped(self) -> None:
        """``optimizer.step()`` returned."""


@contextmanager
def _phase(boundaries: Optional[FabricStepBoundaries], hook: str) -> Generator[None, None, None]:
    """Tell ``boundaries`` (if any) that the Fabric phase ``hook`` runs while the block runs."""
    if boundaries is None:
        yield
        return
    action = f"[Fabric]{hook}"
    boundaries.enter(action)
    try:
        yield
    finally:
        boundaries.leave(action)


class TPUPrecisionPlugin(XLAPrecision):
    """Legacy name of ``XLAPrecision("32-true")``; warns that it is deprecated."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        rank_zero_deprecation("`TPUPrecisionPlugin` is deprecated. Use `xla_plugins.XLAPrecision('32-true')` instead.")
        super().__init__("32-true")


class TPUBf16PrecisionPlugin(XLAPrecision):
    """Legacy name of ``XLAPrecision("bf16-true")``; warns that it is deprecated."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        rank_zero_deprecation(
            "`TPUBf16PrecisionPlugin` is deprecated. Use `xla_plugins.XLAPrecision('bf16-true')` instead."
        )
        super().__init__("bf16-true")

"""Which ``torch.compile`` backend a compiled LightningModule uses, and refusing the one XLA cannot run.

Lightning's ``from_compiled`` keeps the ``torch.compile`` context of a compiled LightningModule in
``module._compiler_ctx["dynamo_ctx"]``; the backend behind it is reached through the
attribute each of torch's wrappers (``CatchErrorsWrapper``, ``ConvertFrame``, ``WrapBackendDebug``)
keeps of the callable it wraps: ``_torchdynamo_orig_backend`` (torch 2.9) or
``_torchdynamo_orig_callable`` (torch 2.8). ``inductor``, torch's
default, lowers to CPU/GPU kernels and fails on XLA tensors (measured: ``InductorError:
LoweringException`` at the first training step on PJRT CPU, torch_xla 2.9); torch_xla registers
its own dynamo backend, ``"openxla"``.
"""

from __future__ import annotations

from typing import Any, Optional

#: Backends known not to run on XLA tensors: the message names torch_xla's own backend instead.
REFUSED_BACKENDS = ("inductor",)


def compile_backend(module: Any) -> Optional[str]:
    """The name of the ``torch.compile`` backend of a compiled LightningModule, or ``None``.

    ``None`` when ``module`` was not compiled (no ``_compiler_ctx``) or the name cannot be found.
    """
    context = getattr(module, "_compiler_ctx", None)
    if not context:
        return None
    backend = getattr(context.get("dynamo_ctx"), "callback", None)
    for _ in range(8):  # unwrap torch's wrappers down to the backend callable
        inner = getattr(backend, "_torchdynamo_orig_backend", None) or getattr(
            backend, "_torchdynamo_orig_callable", None
        )
        if inner is None:
            break
        backend = inner
    name = getattr(backend, "compiler_name", None) or getattr(backend, "__name__", None)
    return name if isinstance(name, str) else None


def check_compile_backend(module: Any) -> None:
    """Refuse a LightningModule compiled with a backend that cannot compile XLA tensors.

    Raises:
        RuntimeError: the backend is one of :data:`REFUSED_BACKENDS` (``torch.compile``'s default,
            ``"inductor"``); the message names torch_xla's backend, ``backend="openxla"``.
    """
    name = compile_backend(module)
    if name in REFUSED_BACKENDS:
        raise RuntimeError(
            f"The LightningModule was compiled with torch.compile's {name!r} backend (torch's default), which"
            " cannot compile XLA tensors. On XLA devices use torch_xla's dynamo backend:"
            " torch.compile(model, backend='openxla')."
        )

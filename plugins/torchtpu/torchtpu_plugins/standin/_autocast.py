"""``torch.autocast("tpu")`` on the stand-in: torch registers no autocast kernel for PrivateUse1.

Without kernels of its own, autocast on PrivateUse1 has nothing to run (every op fails), or, where a
backend registers a pass-through, silently stays in float32. :func:`register` gives the
``AutocastPrivateUse1`` key a pass-through for every op and kernels for two lists, following torch's
autocast policy of CUDA (which TorchTPU's bf16 autocast matches: Linear outputs bf16, a loss stays
float32): :data:`LOWER_PRECISION` ops run in the autocast dtype (``torch.get_autocast_dtype("tpu")``,
bfloat16 by default, as on TorchTPU), :data:`FLOAT32` ops in float32. Only ``"tpu"`` floating tensors other than
float64 are cast, as torch's own autocast does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from torchtpu_plugins.runtime import _torch_contract

#: Ops run in the autocast dtype (matrix products and convolutions).
LOWER_PRECISION = (
    "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm", "chain_matmul", "conv1d", "conv2d", "conv3d",
    "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution", "_convolution",
    "linalg_multi_dot", "linear", "matmul", "mm", "mv", "prelu",
)  # fmt: skip
#: Ops run in float32 (reductions, norms, losses and functions that lose precision in 16 bits).
FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "softplus", "layer_norm", "group_norm", "frobenius_norm", "nuclear_norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "softmax", "log_softmax", "cross_entropy_loss",
)  # fmt: skip
_KEY = "AutocastPrivateUse1"


def _kernel(op: torch._ops.OpOverload, dtype: torch.dtype | None) -> Callable[..., Any]:
    keys = _torch_contract.resolve("_C.DispatchKeySet")(getattr(_torch_contract.resolve("_C.DispatchKey"), _KEY))
    below = _torch_contract.resolve("_C._ExcludeDispatchKeyGuard")

    def kernel(*args: Any, **kwargs: Any) -> Any:
        to = dtype or torch.get_autocast_dtype("tpu")

        def cast(value: Any) -> Any:
            if (
                isinstance(value, torch.Tensor)
                and value.device.type == "tpu"
                and value.is_floating_point()
                and value.dtype not in (torch.float64, to)
            ):
                return value.to(to)
            return value

        with below(keys):
            return op(*tree_map(cast, args), **tree_map(cast, kwargs))

    return kernel


def register() -> torch.library.Library:
    """Register the pass-through and the kernels of both lists for ``AutocastPrivateUse1``.

    Returns:
        The ``torch.library.Library`` holding the registrations (they last as long as it does).
    """
    library = torch.library.Library("_", "IMPL")
    library.fallback(torch.library.fallthrough_kernel, _KEY)
    aten = torch.library.Library("aten", "IMPL")
    for names, dtype in ((LOWER_PRECISION, None), (FLOAT32, torch.float32)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                if "out" in overload:
                    continue
                op = getattr(packet, overload)
                aten.impl(name if overload == "default" else f"{name}.{overload}", _kernel(op, dtype), _KEY)
    library._autocast_kernels = aten  # type: ignore[attr-defined]
    torch.set_autocast_dtype("tpu", torch.bfloat16)  # TorchTPU's default (torch's for PrivateUse1 is float16)
    return library

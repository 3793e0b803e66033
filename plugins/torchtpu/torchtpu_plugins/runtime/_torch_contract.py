"""Every private or experimental torch name the stand-in device relies on, in one place.

torch may rename or drop any of these in a release without notice. :func:`missing` lists those the
installed torch lacks; :func:`check` raises with that list before the stand-in registers anything, and
``tests/test_torchtpu_device.py`` fails on the same list, so a torch release that breaks the contract
is named in one test instead of crashing elsewhere.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

#: Dotted paths below ``torch``: the private and experimental names the stand-in uses.
NAMES = (
    # registers the Python hooks, device guard and device module of PrivateUse1 (experimental; torch >= 2.10)
    "utils.backend_registration._setup_privateuseone_for_python_backend",
    # the PrivateUse1 hooks' base class (its is_available answers torch.accelerator.is_available)
    "_C._acc.PrivateUse1Hooks",
    # a storage over memory it does not own: the zero-copy CPU view of a "tpu" tensor
    "_C._construct_storage_from_data_pointer",
    # a storage-less PrivateUse1 tensor, the shell a "tpu" storage is set into
    "_C._acc.create_empty_tensor",
    # which backend holds PrivateUse1 (the refusal when another one does)
    "_C._get_privateuse1_backend_name",
    # redispatch to the CPU key: set_ and as_strided on "tpu" tensors, below the fallback
    "_C.DispatchKeySet",
    "_C.DispatchKey",
    # the autocast kernels of PrivateUse1 run their op below autocast
    "_C._ExcludeDispatchKeyGuard",
    # the device module torch.tpu (torch.manual_seed and fork_rng read it)
    "_register_device_module",
    # the "tpu_dist" backend: torch.distributed's work class for a backend written in Python, and gloo
    "distributed._Work",
    "distributed.ProcessGroupGloo",
)


def resolve(name: str) -> Any:
    """The object at ``torch.<name>`` (importing the torch submodules on the way).

    Raises:
        AttributeError: the installed torch has no such name.
    """
    import torch

    obj: Any = torch
    path = "torch"
    for part in name.split("."):
        path = f"{path}.{part}"
        if not hasattr(obj, part) and isinstance(obj, types.ModuleType):
            try:
                importlib.import_module(path)
            except ImportError:
                pass
        obj = getattr(obj, part)
    return obj


def missing() -> list[str]:
    """The names of :data:`NAMES` the installed torch lacks (``torch.``-prefixed), in order."""
    absent = []
    for name in NAMES:
        try:
            resolve(name)
        except (AttributeError, ImportError):
            absent.append(f"torch.{name}")
    return absent


def check() -> None:
    """Raise unless the installed torch has every name of :data:`NAMES`.

    Raises:
        RuntimeError: naming the missing names, the installed torch version and the supported range.
    """
    absent = missing()
    if absent:
        import torch

        raise RuntimeError(
            f"the TorchTPU stand-in device needs torch names that torch {torch.__version__} lacks: "
            f"{', '.join(absent)}; supported: torch>=2.11,<2.16"
        )

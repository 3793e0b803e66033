"""``torch.compile(backend="tpu")`` on the stand-in device; TorchTPU's own ``"tpu"`` backend comes with torch_tpu.

torch's dynamo finds :func:`backend` through the ``torch_dynamo_backends`` entry point ``tpu`` of this
distribution, the first time a program names ``backend="tpu"`` (nothing is imported before). It compiles
only where the stand-in runs: it hands the captured graph to torch's ``aot_eager`` backend (AOTAutograd
traces forward and backward; torch's eager kernels run the graphs, which on the stand-in are the CPU
kernels on zero-copy views: no Inductor, no generated code), so a compiled model computes what the eager
one does. Where torch_tpu registers its own ``"tpu"`` backend, dynamo uses that one (a registered backend
is looked up before entry points). Not verified on TPU.
"""

from __future__ import annotations

from typing import Any


def backend(graph_module: Any, example_inputs: list[Any], **options: Any) -> Any:
    """Compile ``graph_module`` (a ``torch.fx.GraphModule``) for the stand-in ``"tpu"`` device with ``aot_eager``.

    Args:
        graph_module: the graph dynamo captured.
        example_inputs: its example inputs (fake tensors).
        **options: ``torch.compile(options=...)``; refused, as TorchTPU's backend refuses Inductor's options.

    Raises:
        RuntimeError: the stand-in device is not running in this process (``TORCHTPU_PLUGINS_DEVICE=cpu``
            unset): this backend runs on the stand-in only; TorchTPU's own comes with torch_tpu.
        ValueError: ``options`` were given.
    """
    from torchtpu_plugins import standin

    if not standin.installed():
        raise RuntimeError(
            "torch.compile(backend='tpu') of torchtpu-plugins runs on its stand-in device only"
            " (TORCHTPU_PLUGINS_DEVICE=cpu set before `import torch`); TorchTPU's own 'tpu' backend comes with"
            " torch_tpu, which is not loaded in this process"
        )
    if options:
        raise ValueError(f"backend 'tpu' takes no options, got {sorted(options)}: TorchTPU's rejects Inductor's")
    from torch._dynamo.backends.registry import lookup_backend

    return lookup_backend("aot_eager")(graph_module, example_inputs)

"""The host-read watch: ``torch.Tensor``'s read methods on XLA tensors routed to a reader, and the user's line.

Each host read inside a step (``.item()``, ``print(tensor)``, ``if tensor:``) cuts the step's graph
and waits for the device. While a run is monitored, the ``torch.Tensor`` methods that read an XLA
tensor to the host (:data:`READ_METHODS`) are wrapped (:func:`wrap_reads`); the wrapper costs one
device check (``Tensor.is_xla``) per call of those methods (never on other tensor operations) and passes each read of
an XLA tensor to the reader of the thread that reads (the compile monitor,
:mod:`xla_plugins.compilation.compile_monitor`): replicas that run as threads of one process (torch_xla's
``xmp.spawn`` with several devices a process, as on PJRT CPU) each see their own reads. For a late
read, :func:`user_line` walks the Python stack to the first frame outside torch, torch_xla, this
mechanism and the standard library; a read from Lightning's or this plugin's own code has none.
:func:`warn_at` issues a report's warning located at such a line (a :class:`SourceLine`), the
user's, as Python shows the location of any warning: ``file:line: Category: message`` followed by
that line of code.
"""

from __future__ import annotations

import linecache
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch
from torch import Tensor

#: ``torch.Tensor`` methods that copy an XLA tensor's value to the host, wrapped while a run is monitored.
READ_METHODS = (
    "item",
    "tolist",
    "numpy",
    "cpu",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "__repr__",
    "__format__",
)

#: Modules whose frames are the mechanism of a read, skipped when looking for the line that asked for it.
_SKIPPED = (
    "torch",
    "torch_xla",
    "xla_plugins.compilation.host_reads",
    "xla_plugins.compilation.compile_monitor",
    "xla_plugins.compilation.fabric_steps",
    "importlib",
    "contextlib",
    "functools",
    "typing",
)
#: Modules whose frames mean Lightning or this plugin asked for the read, not the user.
OWN = ("lightning", "pytorch_lightning", "lightning_fabric", "lightning_utilities", "xla_plugins", "trainer_plugins")


class Reader(Protocol):
    """What the wrapped read methods call: the compile monitor (``compile_monitor.CompileMonitor``)."""

    #: ``True`` while the reader runs a read: reads inside it go straight to torch
    _reading: bool

    def read(self, method: str, original: Callable[..., Any], tensor: Tensor, args: Any, kwargs: Any) -> Any:
        """Run ``original(tensor, *args, **kwargs)``, the read ``tensor.<method>(...)`` of an XLA tensor."""


#: method name -> torch's own method, while reads are wrapped
_ORIGINALS: dict[str, Callable[..., Any]] = {}
#: ``.reader``: the reader of the thread, set by :func:`wrap_reads`
_LOCAL = threading.local()
#: every thread's reader; the methods are given back when the last one is unwrapped
_READERS: list[Reader] = []
_LOCK = threading.Lock()


def wrap_reads(reader: Reader) -> None:
    """Route :data:`READ_METHODS` of XLA tensors read in this thread through ``reader.read``.

    Idempotent; a reader this thread had before is replaced. Reads in other threads go to their own
    readers, or straight to torch where a thread has none.
    """
    with _LOCK:
        previous = getattr(_LOCAL, "reader", None)
        if previous is not None and previous in _READERS:
            _READERS.remove(previous)
        _LOCAL.reader = reader
        _READERS.append(reader)
        for name in READ_METHODS:
            if name in _ORIGINALS:
                continue
            original = getattr(torch.Tensor, name)
            _ORIGINALS[name] = original
            setattr(torch.Tensor, name, _read_wrapper(name, original))


def _read_wrapper(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a ``torch.Tensor`` method) going through the reading thread's reader for XLA tensors."""

    def wrapper(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        # ``is_xla`` first: most reads in a step are of CPU tensors (the optimizer's step counts), and it
        # costs a fifth of ``self.device.type`` (which builds a device object) or of the thread's reader
        if not self.is_xla:  # type: ignore[attr-defined]  # a property of torch's C tensor, not in its stubs
            return original(self, *args, **kwargs)
        reader = getattr(_LOCAL, "reader", None)
        if reader is None or reader._reading:
            return original(self, *args, **kwargs)
        return reader.read(name, original, self, args, kwargs)

    wrapper.__name__, wrapper.__qualname__, wrapper.__doc__ = name, f"Tensor.{name}", original.__doc__
    return wrapper


def unwrap_reads() -> None:
    """Stop routing this thread's reads; give ``torch.Tensor`` its own read methods back if no thread has a reader."""
    with _LOCK:
        reader = getattr(_LOCAL, "reader", None)
        _LOCAL.reader = None
        if reader is not None and reader in _READERS:
            _READERS.remove(reader)
        if _READERS:
            return
        for name, original in _ORIGINALS.items():
            setattr(torch.Tensor, name, original)
        _ORIGINALS.clear()


def _module_of(frame: Any) -> str:
    return frame.f_globals.get("__name__", "") or ""


def _matches(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def is_own(module: str) -> bool:
    """Whether the module named ``module`` is Lightning's or this plugin's (:data:`OWN`), not the user's."""
    return _matches(module, OWN)


def user_frame(frame: Any, through: tuple[str, ...] = ()) -> Optional[Any]:
    """The first frame from ``frame`` outward that is the user's; ``None`` if Lightning's or this plugin's own.

    Frames of modules in ``through`` (prefixes, e.g. Lightning's when Fabric's module wrapper called
    in) are passed like the mechanism's own.
    """
    while frame is not None:
        module = _module_of(frame)
        top = module.partition(".")[0]
        if _matches(module, _SKIPPED) or _matches(module, through) or top in sys.stdlib_module_names:
            frame = frame.f_back
            continue
        return None if _matches(module, OWN) else frame
    return None


@dataclass(frozen=True)
class SourceLine:
    """A line of the user's code that a report names, and where its warning is located.

    Attributes:
        filename: the source file (a code object's ``co_filename``).
        lineno: the line number, from 1.
        module: the ``__name__`` of the module that runs the line (``""``: derived from ``filename``).
        definition: for the start of a function, its name (``"Model.training_step"``); ``""`` for a line
            inside a function.
    """

    filename: str
    lineno: int
    module: str = ""
    definition: str = ""

    @classmethod
    def of_frame(cls, frame: Any) -> SourceLine:
        """The line a Python frame is running."""
        return cls(frame.f_code.co_filename, frame.f_lineno, _module_of(frame))

    def text(self) -> str:
        """``file:line  `code``` for a line inside a function, ``file:line (Model.training_step)`` for a definition."""
        if self.definition:
            return f"{self.filename}:{self.lineno} ({self.definition})"
        return line_text(self.filename, self.lineno)


def warn_at(message: str, category: type[Warning], line: Optional[SourceLine]) -> None:
    """Warn ``message`` located at ``line`` (``warnings.warn_explicit``), as if that line had warned.

    Python's filters and its once-per-location registry apply as for a warning issued at that line
    (the registry of the line's module). Without a line (the cause is not in the user's code), the
    warning is located at the caller of the caller of this function.
    """
    if line is None:
        warnings.warn(message, category, stacklevel=3)
        return
    module = sys.modules.get(line.module) if line.module else None
    module_globals = vars(module) if module is not None else None
    registry = module_globals.setdefault("__warningregistry__", {}) if module_globals is not None else None
    # The source line is asked of the module's loader only for a module read from a file: the __main__
    # of `python -c` (and of a notebook) has BuiltinImporter as its loader, whose get_source raises ImportError
    source_globals = module_globals if module_globals is not None and "__file__" in module_globals else None
    warnings.warn_explicit(message, category, line.filename, line.lineno, line.module or None, registry, source_globals)


def line_text(filename: str, lineno: int) -> str:
    """``file:line  `code``` for the report (the source line from ``linecache``, blank if unreadable)."""
    code = linecache.getline(filename, lineno).strip()
    return f"{filename}:{lineno}  `{code}`"


def user_line(frame: Any) -> Optional[SourceLine]:
    """The line of the first frame from ``frame`` outward that is the user's; ``None`` if Lightning's own."""
    found = user_frame(frame)
    return None if found is None else SourceLine.of_frame(found)


def read_cause(method: str) -> str:
    """What a read through ``Tensor.<method>`` looks like in the user's code, for the report."""
    if not method.startswith("__"):
        return f"a host read (`.{method}()`)"
    what = {
        "__bool__": "`if tensor:` or bool(tensor)",
        "__repr__": "printing or formatting a tensor",
        "__format__": "formatting a tensor (f-string)",
    }
    return f"a host read ({what.get(method, f'{method.strip(chr(95))}(tensor)')})"


__all__ = [
    "READ_METHODS",
    "Reader",
    "SourceLine",
    "is_own",
    "line_text",
    "read_cause",
    "unwrap_reads",
    "user_frame",
    "user_line",
    "warn_at",
    "wrap_reads",
]

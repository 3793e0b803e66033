"""How a checkpoint, one file or a directory, becomes visible only once it is complete.

The writer puts the checkpoint under a temporary name (:func:`temporary_path`), then commits it:

* on a local disk, by a rename: ``os.replace`` for a file (atomic on POSIX); for a directory over
  an earlier one, Linux's ``renameat2(RENAME_EXCHANGE)`` swaps the two names in one step and the
  earlier one is then removed (:func:`commit_local`);
* on an fsspec filesystem (an object store has no atomic rename), by moving it into place and then
  writing the commit marker ``<path>.commit`` holding its size in bytes (:func:`commit_remote`);
  a checkpoint counts as complete only with a marker matching its size (:func:`is_committed`).

Nothing here is in Lightning or torch: Lightning's checkpoint IO plugins write in place,
``torch.distributed.checkpoint`` writes a directory's files in place (only its own ``.metadata``
under a temporary name), and a backend's checkpoint manager may never replace a checkpoint (a new
directory per step, a metadata file written last). The temporary names start with a dot and end
in ``.tmp-<host>-<pid>-<id>`` (:func:`temporary_path`), so Lightning's search for ``last*.ckpt`` never
takes one, and the writer can be told: :func:`remove_stale_temporaries` removes those that a writer
of this host left behind when it was killed (its process no longer runs).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import socket
import uuid
from typing import Any

import fsspec
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH

#: Suffix of the commit marker written beside a checkpoint on a non-local filesystem.
COMMIT_SUFFIX = ".commit"
_AT_FDCWD = -100  # <fcntl.h>: paths relative to the working directory
_RENAME_EXCHANGE = 2  # <linux/fs.h>: swap the two names


def is_local(path: _PATH) -> bool:
    """Whether ``path`` is on the local filesystem (fsspec protocol ``file``, as Lightning decides)."""
    return fsspec.utils.get_protocol(str(path)) == "file"


#: The kinds of temporary names (:func:`temporary_path`): a checkpoint being written, an earlier one set aside.
TEMPORARY_KINDS = ("tmp", "old")
_TEMPORARY_NAME = re.compile(
    r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<host>[^/]+)-(?P<pid>[0-9]+)-(?P<id>[0-9a-f]{12})$"
)


def temporary_path(path: _PATH, kind: str = "tmp") -> str:
    """A fresh name beside ``path`` for its checkpoint while it is written.

    ``<dir>/.<name>.<kind>-<host>-<pid>-<12 hex digits>``: the writer's host name
    (``socket.gethostname()``) and process id say who owns it (:func:`remove_stale_temporaries`).

    Raises:
        ValueError: ``kind`` is not one of :data:`TEMPORARY_KINDS`.
    """
    if kind not in TEMPORARY_KINDS:
        raise ValueError(f"kind={kind!r} is not valid: choose one of {list(TEMPORARY_KINDS)}.")
    path = str(path)
    directory, name = os.path.split(path)
    host = socket.gethostname().replace("/", "_") or "localhost"
    return os.path.join(directory, f".{name}.{kind}-{host}-{os.getpid()}-{uuid.uuid4().hex[:12]}")


def _process_runs(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (``kill(pid, 0)``; one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(directory: _PATH) -> list[str]:
    """Remove the temporary checkpoints in ``directory`` whose writers were killed; return their paths.

    Only names of :func:`temporary_path`'s form are considered, and one is removed only when its
    writer ran on this host (the host name in it is ``socket.gethostname()``) and that process no
    longer runs: a live writer's file, one of another host (which this host cannot check, on a
    shared filesystem) and any other file are kept; so is an earlier checkpoint set aside
    (``.<name>.old-…``) while ``<name>`` is missing (it is then the only copy). A process id
    reused by a new process keeps the file until that one ends too. Nothing is done for a
    directory that does not exist, or on an fsspec filesystem other than the local one (an object
    store's temporaries are not removed).

    Raises:
        OSError: the filesystem's, when the directory cannot be listed.
    """
    directory = str(directory) or "."
    if not is_local(directory) or not os.path.isdir(directory):
        return []
    host = socket.gethostname().replace("/", "_") or "localhost"
    removed = []
    for entry in os.listdir(directory):
        match = _TEMPORARY_NAME.match(entry)
        if match is None or match["host"] != host or _process_runs(int(match["pid"])):
            continue
        if match["kind"] == "old" and not os.path.lexists(os.path.join(directory, match["name"])):
            continue  # the earlier checkpoint, set aside by a writer killed before the new one took its name
        path = os.path.join(directory, entry)
        _remove_local(path)
        removed.append(path)
    return removed


def size(path: _PATH) -> int:
    """Bytes of the file ``path``, or of all files under the directory ``path``."""
    fs = get_filesystem(path)
    return int(fs.du(path, total=True)) if fs.isdir(path) else int(fs.size(path))


def is_committed(path: _PATH) -> bool:
    """Whether the checkpoint ``path`` (a file or a directory) is complete, as committed by this module.

    On a local disk: it exists (it only ever appears whole, by a rename). Elsewhere (fsspec URLs):
    it and its marker ``<path>.commit`` exist and the marker holds its size in bytes (:func:`size`).
    """
    fs = get_filesystem(path)
    if not fs.exists(path):
        return False
    if is_local(path):
        return True
    marker = f"{path}{COMMIT_SUFFIX}"
    if not fs.exists(marker):
        return False
    with fs.open(marker, "rb") as stream:
        text = stream.read().decode(errors="replace").strip()
    return text == str(size(path))


def _exchange(first: str, second: str) -> bool:
    """Swap the names ``first`` and ``second`` in one step (Linux ``renameat2``); ``False`` where not offered."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2: Any = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # kernel or filesystem without it
        return False
    raise OSError(error, os.strerror(error), first, None, second)


def _remove_local(path: str) -> None:
    import shutil

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def commit_local(temporary: str, path: _PATH) -> None:
    """Give the complete local checkpoint ``temporary`` (file or directory) the name ``path``, replacing an earlier one.

    A file over a file, or anything onto a free name: ``os.replace`` (atomic). Where a directory is
    involved (one over an existing checkpoint, or a file over a directory): the two names are
    exchanged (``renameat2(RENAME_EXCHANGE)``, atomic), then the earlier checkpoint, now under the
    temporary name, is removed; a process killed in between leaves that hidden
    ``.<name>.tmp-<host>-<pid>-<id>`` behind (removed later by :func:`remove_stale_temporaries`),
    and ``path`` already holds the new checkpoint. Where the exchange is not offered (not Linux, or
    a filesystem without it), the earlier one is renamed aside first: a process killed between the
    two renames leaves it complete, but under ``.<name>.old-<host>-<pid>-<id>`` only (kept by
    :func:`remove_stale_temporaries` while ``path`` is missing).
    """
    path = str(path)
    if not os.path.lexists(path) or not (os.path.isdir(temporary) or os.path.isdir(path)):
        os.replace(temporary, path)
        return
    if _exchange(temporary, path):
        _remove_local(temporary)
        return
    aside = temporary_path(path, "old")
    os.replace(path, aside)
    os.replace(temporary, path)
    _remove_local(aside)


def commit_remote(temporary: str, path: _PATH) -> None:
    """Move the complete checkpoint ``temporary`` (an object, or a prefix of objects) onto ``path``, then mark it.

    The earlier checkpoint of that name loses its marker first, then is removed, so nothing of it is
    mixed with the new one; the marker ``<path>.commit`` is written last, holding :func:`size`.
    """
    path = str(path)
    fs = get_filesystem(path)
    marker = f"{path}{COMMIT_SUFFIX}"
    if fs.exists(marker):
        fs.rm(marker)
    if fs.exists(path):
        fs.rm(path, recursive=True)
    fs.mv(temporary, path, recursive=True)
    with fs.open(marker, "wb") as stream:
        stream.write(str(size(path)).encode())


def commit(temporary: str, path: _PATH) -> None:
    """:func:`commit_local` or :func:`commit_remote`, by where ``path`` is."""
    (commit_local if is_local(path) else commit_remote)(temporary, path)


def remove(path: _PATH) -> None:
    """Remove the checkpoint ``path`` (file or directory) and its commit marker, whichever exist."""
    path = str(path)
    if is_local(path):
        _remove_local(path)
        return
    fs = get_filesystem(path)
    for each in (f"{path}{COMMIT_SUFFIX}", path):
        if fs.exists(each):
            fs.rm(each, recursive=True)

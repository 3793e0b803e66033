"""Supported versions: read from a distribution's own requirements, checked against what is installed."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, requires, version
from typing import Optional

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version


def unsupported_versions(distribution: str, names: Optional[Iterable[str]] = None) -> list[str]:
    """Messages for installed dependencies of ``distribution`` outside the versions it declares.

    The supported ranges are the ``Requires-Dist`` lines of the distribution's metadata (its
    ``pyproject.toml`` dependencies), so they are declared once. Dependencies that are not installed
    are not reported here (selecting the backend reports them).

    Args:
        distribution: an installed distribution (``"trainer-plugins"``, ``"lightning"``).
        names: only these dependencies (distribution names); default all of them.

    Returns:
        One message per dependency whose installed version the declared specifier excludes, naming
        the dependency, the installed version and the supported range. Empty when all fit, or when
        ``distribution`` itself is not installed.
    """
    try:
        declared = [Requirement(line) for line in requires(distribution) or []]
    except PackageNotFoundError:
        return []
    wanted = None if names is None else {canonicalize_name(name) for name in names}
    problems = []
    for requirement in declared:
        name = canonicalize_name(requirement.name)
        if requirement.marker is not None or (wanted is not None and name not in wanted):
            continue
        try:
            installed = Version(version(requirement.name))
        except (PackageNotFoundError, InvalidVersion):
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            problems.append(
                f"{distribution} supports {requirement.name}{requirement.specifier}, but {requirement.name} {installed}"
                " is installed"
            )
    return problems


def warn_unsupported_versions(distribution: str, names: Optional[Iterable[str]] = None) -> None:
    """Emit a ``RuntimeWarning`` for each message of :func:`unsupported_versions`."""
    for message in unsupported_versions(distribution, names):
        warnings.warn(f"{message}; it may not work. Install a supported version.", RuntimeWarning, stacklevel=3)

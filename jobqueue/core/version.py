"""The installed distribution's version, for `sa-core --version` and the build-info metric."""

from __future__ import annotations

from importlib import metadata

__all__ = ["VERSION"]

# NOTE: from the installed metadata (the wheel, or the checkout's editable install), so it cannot
# drift from pyproject.toml; "unknown" only when the code runs without being installed at all.
try:
    VERSION = metadata.version("sa-core")
except metadata.PackageNotFoundError:
    VERSION = "unknown"

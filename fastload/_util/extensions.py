"""fastload's optional C extensions, loaded in one place: each is None where it was not built
(setup.py said why), and one that is installed but does not load warns once, naming the error."""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from types import ModuleType


def load_extension(name: str, what: str, fallback: str) -> ModuleType | None:
    """The extension module ``name`` (``what`` it is, in words), or None where it was not built;
    installed but not loading: None and a RuntimeWarning saying ``fallback`` is used instead."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        warnings.warn(
            f"fastload: the {what} {spec.origin} is installed but does not load "
            f"({type(exc).__name__}: {exc}); {fallback} (reinstalling fastload restores it)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None

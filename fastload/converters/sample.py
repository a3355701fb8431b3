"""What flows from a source to a writer: planned item references, then loaded samples."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy costs 0.1 s to import; a plain image-folder conversion never needs it
    import numpy as np

_UNSAFE_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-/]")


@dataclass(frozen=True)
class SourceItem:
    """A cheap, picklable reference to one raw sample; plans are made of these."""

    key: str
    where: str  # the file (and row) it comes from, for error messages
    size_hint: int  # bytes it is expected to take in a shard
    ref: Any = None  # source-specific locator (path, row number, tar offset, ...)
    stamp: tuple[int, ...] = ()  # (size, mtime_ns) of each file it is read from: resume redoes a shard when one changes


@dataclass
class Sample:
    """One loaded sample: an encoded image (bytes), decoded pixels (HWC uint8) or no image, a label,
    extra fields by extension (text, json, .npy arrays, ...)."""

    key: str
    where: str
    image: bytes | np.ndarray | None
    label: int | None = None
    extra: dict[str, bytes] = field(default_factory=dict)


def file_stamp(*paths: str | os.PathLike[str]) -> tuple[int, ...]:
    """(size, mtime_ns) of each file, flattened: a SourceItem's ``stamp``. A stat the sources make
    anyway; a content hash would read the whole input again on every rerun."""
    stamp: list[int] = []
    for path in paths:
        st = os.stat(path)
        stamp += (st.st_size, st.st_mtime_ns)
    return tuple(stamp)


def make_key(relative_name: str) -> str:
    """A WebDataset-safe key from a relative file name: no extension, no dots, no odd characters."""
    stem = relative_name.rsplit(".", 1)[0] if "." in relative_name.rsplit("/", 1)[-1] else relative_name
    return _UNSAFE_KEY_CHARS.sub("_", stem).strip("/") or "_"


def unique_keys(keys: list[str]) -> list[str]:
    """Make keys unique deterministically by suffixing repeats with ``_N``."""
    seen: dict[str, int] = {}
    taken = set(keys)
    out = []
    for key in keys:
        n = seen.get(key, 0)
        seen[key] = n + 1
        if n == 0:
            out.append(key)
            continue
        candidate = f"{key}_{n}"
        while candidate in taken:
            n += 1
            candidate = f"{key}_{n}"
        seen[key] = n + 1
        taken.add(candidate)
        out.append(candidate)
    return out

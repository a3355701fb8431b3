"""Error types and the bad-sample policy (raise, or skip and count)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, cast

OnError = Literal["raise", "skip"]
ON_ERROR_CHOICES: tuple[str, ...] = ("raise", "skip")


class FastloadError(Exception):
    """Base class of every error fastload raises on purpose."""


class DatasetIndexError(FastloadError, ValueError):
    """index.json (or a DALI .idx file) is missing, malformed or of an unsupported version."""


class ShardError(FastloadError):
    """A shard file is missing, truncated or does not match the index."""


class RemoteError(FastloadError):
    """A remote object could not be read or written; the message names the URL."""


def rebuild_error(name: str, message: str) -> FastloadError:
    """Re-create, in the main process, a fastload error a worker raised (by class name)."""
    kinds = {cls.__name__: cls for cls in (DatasetIndexError, ShardError, RemoteError)}
    return kinds.get(name, FastloadError)(message)


class SampleError(FastloadError):
    """One sample cannot be read or decoded; says where it came from and why."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason

    def __reduce__(self) -> tuple:
        return (type(self), (self.where, self.reason))  # intact through pickle (multiprocessing, spawned workers)


def check_on_error(value: str) -> OnError:
    """Validate an ``on_error`` argument, naming the allowed values when it is wrong."""
    if value not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error must be one of {ON_ERROR_CHOICES}, got {value!r}")
    return cast(OnError, value)  # one of ON_ERROR_CHOICES, OnError's values


@dataclass
class SkipLog:
    """Samples skipped under ``on_error="skip"``: each one with its reason, and counts by reason."""

    entries: list[dict[str, str]] = field(default_factory=list)

    def add(self, key: str, where: str, reason: str) -> None:
        """Record one skipped sample."""
        self.entries.append({"key": key, "where": where, "reason": reason})

    def __len__(self) -> int:
        return len(self.entries)

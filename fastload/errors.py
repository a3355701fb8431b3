"""Error types and the bad-sample policy (raise, or skip and count)."""

from __future__ import annotations

import math
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


DEFAULT_MAX_SKIPPED = 0.1  # on_error="skip" passes over at most a tenth of an epoch's samples unless told otherwise


def check_max_skipped(value: int | float | None) -> int | float | None:
    """Validate a ``max_skipped`` argument: a count of samples (int >= 0), a share of the epoch's
    samples (float, 0 < share <= 1) or None (no limit), as SPDL's ``max_failures`` takes."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    if isinstance(value, float) and 0 < value <= 1:
        return value
    raise ValueError(f"max_skipped must be a count of samples (int >= 0), a share of the epoch (0 < float <= 1) or None, got {value!r}")


def skip_allowance(max_skipped: int | float | None, samples: int) -> int:
    """How many of ``samples`` samples ``max_skipped`` lets on_error='skip' pass over (a share rounded up)."""
    if max_skipped is None:
        return samples
    if isinstance(max_skipped, float):
        return math.ceil(max_skipped * samples)
    return min(max_skipped, samples)


@dataclass
class SkipLog:
    """Samples skipped under ``on_error="skip"``: each bad sample once (however often it was passed
    over, in however many epochs), with its reason."""

    entries: list[dict[str, str]] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set, repr=False)

    def add(self, key: str, where: str, reason: str) -> None:
        """Record the skipped sample ``where``, unless it is recorded already."""
        if where not in self._seen:
            self._seen.add(where)
            self.entries.append({"key": key, "where": where, "reason": reason})

    def __len__(self) -> int:
        return len(self.entries)

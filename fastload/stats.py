"""Loader counters: samples, batches, time spent waiting for data, skipped samples, batches the
DALI backend handed back to the CPU path."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fastload.errors import SkipLog


@dataclass
class LoaderStats:
    """What a loader did so far; ``wait_s`` is the time the caller spent blocked on data."""

    batches: int = 0
    samples: int = 0
    wait_s: float = 0.0
    skipped: SkipLog = field(default_factory=SkipLog)
    redone_on_cpu: int = 0  # batches DALI could not read or decode, redone on the CPU path
    started: float = field(default_factory=time.perf_counter)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Count the enclosed time as waiting for data."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.wait_s += time.perf_counter() - start

    def record_batch(self, samples: int) -> None:
        """Count one delivered batch."""
        self.batches += 1
        self.samples += samples

    def record_skip(self, where: str, reason: str) -> None:
        """Count one sample replaced under on_error='skip'."""
        self.skipped.add(key=where.rsplit(":", 1)[-1], where=where, reason=reason)

    def summary(self) -> str:
        """One line for logs."""
        elapsed = time.perf_counter() - self.started
        return (
            f"{self.samples} samples in {self.batches} batches, {self.samples / max(elapsed, 1e-9):.0f}/s, "
            f"waited {self.wait_s:.1f}s, skipped {len(self.skipped)}"
        )

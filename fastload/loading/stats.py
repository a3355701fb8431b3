"""Loader counters, live: samples, batches, skips, and each epoch's time by stage.

Workers time their stages per sample (fastload.workers.stage_clock: their rows of a shared
table). The main process times what it does for each batch: waiting for the
workers, the hand-off (slot lending or copying, shaping the outputs, ``collate_fn=``, ``batch_map=``) and the
host-to-device copy (with Normalize/ToDtype there; a CUDA copy is asynchronous, so only its
launch counts). What is left of an epoch's wall time is the training loop's own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace

import numpy as np

from fastload.errors import SkipLog
from fastload.workers.stage_clock import READ_BYTES, SAMPLES, WORKER_STAGES, StageCounters

STALL_THRESHOLD = 0.1  # a share of step time spent waiting above which a run is input-bound


def stall_verdict(stall: float, cause: str = "") -> str:
    """The verdict ``fastload bench`` and ``loader.stats`` give for ``stall``, the share of step time
    spent waiting for data; ``cause`` names the stage that dominates, when known."""
    if stall > STALL_THRESHOLD:
        return f"input-bound by {100 * stall:.0f}%: {cause + '; ' if cause else ''}try more workers or backend=dali"
    return f"not input-bound ({100 * stall:.0f}% of step time waiting for data)"


@dataclass(frozen=True)
class EpochStats:
    """One epoch (or the part of it run before it was broken off), by stage."""

    epoch: int
    complete: bool
    batches: int
    samples: int
    wall_s: float  # from its first batch asked for to its last handed out
    wait_s: float  # the training loop blocked on data
    handoff_s: float  # slot lending or copying, shaping the outputs, collate_fn=, batch_map=
    device_s: float  # host-to-device copy and Normalize/ToDtype
    workers: np.ndarray | None  # (processes + 1, COLUMNS) this epoch's counters; None: not measured (DALI)
    remote: bool  # reads come from a remote dataset's cache (and wait for its downloads)

    @property
    def stall(self) -> float:
        """The share of the epoch the training loop spent waiting for data."""
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0

    def stage_s(self) -> dict[str, float]:
        """Seconds per worker stage, summed over the processes (empty when not measured)."""
        if self.workers is None:
            return {}
        totals = self.workers.sum(axis=0)
        return {name: float(totals[column]) for column, name in enumerate(WORKER_STAGES)}

    def busy_processes(self) -> int:
        """The processes that did work this epoch (the workers, or the main process inline)."""
        return 0 if self.workers is None else int(np.count_nonzero(self.workers[:, SAMPLES]))

    def cause(self) -> str:
        """The worker stage that dominates, as the verdict names it ('' when not measured)."""
        stages = self.stage_s()
        total = sum(stages.values())
        if not total:
            return ""
        name = max(stages, key=lambda s: stages[s])
        return f"{'decoding' if name == 'decode' else name} is {100 * stages[name] / total:.0f}% of worker time"

    def verdict(self) -> str:
        """:func:`stall_verdict` of this epoch."""
        return stall_verdict(self.stall, self.cause())

    def line(self) -> str:
        """One line for logs."""
        head = (f"epoch {self.epoch}{'' if self.complete else ' (broken off)'}: {self.samples} samples in {self.batches} batches, "
                f"{self.wall_s:.1f}s ({self.samples / max(self.wall_s, 1e-9):.0f}/s); waited {self.wait_s:.2f}s "
                f"({100 * self.stall:.0f}%), hand-off {self.handoff_s:.2f}s, to device {self.device_s:.2f}s")
        if self.workers is None:
            return head + "; worker stages not measured (DALI runs them in its own pipeline)"
        stages = self.stage_s()
        total = sum(stages.values()) or 1e-9
        read = float(self.workers[:, READ_BYTES].sum())
        parts = ", ".join(f"{name} {100 * seconds / total:.0f}%" for name, seconds in stages.items())
        return (f"{head}; {self.busy_processes()} processes, {total:.1f}s of work: {parts} "
                f"(read {read / 1e6:.1f} MB {'remote' if self.remote else 'local'})")


@dataclass(frozen=True)
class _RunningEpoch:
    """What :meth:`LoaderStats.end_epoch` compares against: the loader's totals and counters at its start."""

    epoch: int
    start: float
    totals: tuple[float, ...]
    counters: StageCounters | None
    snapshot: np.ndarray | None
    remote: bool


@dataclass
class LoaderStats:
    """What a loader did so far; ``wait_s`` is the time the caller spent blocked on data, and
    ``epochs`` holds each epoch's :class:`EpochStats` as it ends."""

    batches: int = 0
    samples: int = 0
    tokens: int = 0  # a token loader's real (not padding) tokens delivered
    wait_s: float = 0.0
    inside_s: float = 0.0  # time in the loader's next(): waiting, hand-off and device copy
    device_s: float = 0.0
    skipped: SkipLog = field(default_factory=SkipLog)
    redone_on_cpu: int = 0  # batches DALI could not read or decode, redone on the CPU path
    started: float = field(default_factory=time.perf_counter)
    epochs: list[EpochStats] = field(default_factory=list)
    _running: _RunningEpoch | None = None
    _epoch_skips: set[str] = field(default_factory=set)  # the samples skipped in the running epoch

    @contextmanager
    def _adding_time(self, counter: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, counter, getattr(self, counter) + time.perf_counter() - start)

    def waiting(self) -> AbstractContextManager[None]:
        """Count the enclosed time as waiting for data."""
        return self._adding_time("wait_s")

    def to_device(self) -> AbstractContextManager[None]:
        """Count the enclosed time as the host-to-device copy."""
        return self._adding_time("device_s")

    def record_batch(self, samples: int) -> None:
        """Count one delivered batch."""
        self.batches += 1
        self.samples += samples

    def record_tokens(self, tokens: int) -> None:
        """Count the real tokens of one delivered batch (a token loader's)."""
        self.tokens += tokens

    def add_inside(self, seconds: float) -> None:
        """Count time spent inside the loader's ``next()``."""
        self.inside_s += seconds

    def record_redone_on_cpu(self) -> None:
        """Count one batch DALI could not decode, redone on the CPU path."""
        self.redone_on_cpu += 1

    def record_skip(self, where: str, reason: str) -> int:
        """Count the sample ``where`` replaced under on_error='skip' (each sample once); returns how
        many samples the running epoch has skipped."""
        self.skipped.add(key=where.rsplit(":", 1)[-1], where=where, reason=reason)
        self._epoch_skips.add(where)
        return len(self._epoch_skips)

    def _totals(self) -> tuple[float, ...]:
        return self.batches, self.samples, self.wait_s, self.inside_s, self.device_s

    def begin_epoch(self, epoch: int, counters: StageCounters | None, remote: bool) -> object:
        """An epoch starts (its first batch is asked for); ``counters``: its workers' (None: not
        measured). Returns the token that ends it; an epoch still running is ended as broken off."""
        if self._running is not None:
            self.end_epoch(self._running, complete=False)
        snapshot = counters.snapshot() if counters is not None else None
        self._epoch_skips = set()
        self._running = _RunningEpoch(epoch, time.perf_counter(), self._totals(), counters, snapshot, remote)
        return self._running

    def count_from(self, token: object, snapshot: np.ndarray) -> object:
        """The running epoch ``token`` counts its workers' stages from ``snapshot`` (counters taken
        when work for it began before it started: batches made ahead); returns its token now."""
        running = self._running
        if running is None or running is not token or running.snapshot is None:
            return token
        self._running = replace(running, snapshot=snapshot)
        return self._running

    def end_epoch(self, token: object, complete: bool) -> None:
        """The epoch ``token`` began ends (``complete``: its last batch was handed out) and joins
        ``epochs``; nothing happens when it has ended already."""
        running = self._running
        if running is None or running is not token:
            return
        self._running = None
        batches, samples, wait, inside, device = (now - then for now, then in zip(self._totals(), running.totals))
        workers = None
        if running.counters is not None and running.snapshot is not None:
            workers = running.counters.snapshot() - running.snapshot
        self.epochs.append(EpochStats(running.epoch, complete, int(batches), int(samples), time.perf_counter() - running.start,
                                      wait, max(0.0, inside - wait - device), device, workers, running.remote))

    def summary(self) -> str:
        """One line per epoch so far, then the latest epoch's verdict (as ``fastload bench`` words it)."""
        if not self.epochs:
            elapsed = time.perf_counter() - self.started
            return f"{self.samples} samples in {self.batches} batches, {self.samples / max(elapsed, 1e-9):.0f}/s, no epoch ended yet"
        lines = [epoch.line() for epoch in self.epochs]
        lines.append(f"verdict: {self.epochs[-1].verdict()}; skipped {len(self.skipped)}")
        return "\n".join(lines)

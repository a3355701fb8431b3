"""Stage clocks of the loader's processes: each worker times its stages per sample (reading,
decoding, transform, the user's ``map=``) into its own row of a small float64 table in one
anonymous shared mapping made before the workers fork, so nothing per sample travels through a
pipe; a few ``perf_counter`` calls a sample (~1 us against ~1-5 ms of decoding). The training
process reads the table into its stats (fastload.loading.stats)."""

from __future__ import annotations

import mmap
import time

import numpy as np

from fastload._util.stages import DECODE, MAP, READ, TRANSFORM, WORKER_STAGES

__all__ = ["BUSY", "COLUMNS", "DECODE", "MAP", "READ", "READ_BYTES", "SAMPLES", "TRANSFORM", "WORKER_STAGES", "StageClock",
           "StageCounters", "untimed"]
READ_BYTES, SAMPLES, BUSY = range(len(WORKER_STAGES), len(WORKER_STAGES) + 3)  # bytes read, samples made, seconds in tasks
COLUMNS = len(WORKER_STAGES) + 3
class StageClock:
    """One process's stage timer over its row of a :class:`StageCounters` table: ``start`` marks
    the time, each ``lap`` adds the time since the last mark to a stage. Counts gather in a plain
    list and reach the shared row at each ``flush`` (once a batch part: a numpy element update
    costs ~0.3 us, a list one ~0.05 us)."""

    __slots__ = ("mark", "pending", "row")

    def __init__(self, row: np.ndarray) -> None:
        self.row = row
        self.pending = [0.0] * COLUMNS
        self.mark = time.perf_counter()

    def start(self) -> None:
        """Mark now: the next lap counts from here."""
        self.mark = time.perf_counter()

    def lap(self, stage: int) -> None:
        """Add the time since the last mark to ``stage`` and mark now."""
        now = time.perf_counter()
        self.pending[stage] += now - self.mark
        self.mark = now

    def count(self, column: int, amount: float) -> None:
        """Add ``amount`` to a counter column (bytes, samples, busy seconds)."""
        self.pending[column] += amount

    def flush(self) -> None:
        """Add the counts gathered so far to the shared row."""
        self.row += self.pending
        self.pending = [0.0] * COLUMNS


def untimed() -> StageClock:
    """A clock whose counts go nowhere (callers that keep no stats: DALI's CPU redo, torch's workers)."""
    return StageClock(np.zeros(COLUMNS))


class StageCounters:
    """Stage counters of ``processes`` processes (row w: worker w; the last row: the main process
    working inline), in an anonymous shared mapping the workers inherit when they fork."""

    def __init__(self, processes: int) -> None:
        self._mapping = mmap.mmap(-1, (processes + 1) * COLUMNS * 8)
        self.table = np.frombuffer(self._mapping, dtype=np.float64).reshape(processes + 1, COLUMNS)

    def clock(self, row: int) -> StageClock:
        """The clock writing row ``row`` (-1: the main process's)."""
        return StageClock(self.table[row])

    def snapshot(self) -> np.ndarray:
        """A copy of the counters now."""
        return self.table.copy()

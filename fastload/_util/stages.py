"""The stages a worker times a sample's making in (the columns of its stage-clock row,
fastload.workers.stage_clock), and the one call of a clock that code below the workers makes: a
modality's decode (fastload.av) is handed the worker's clock and laps these stages on it."""

from __future__ import annotations

from typing import Protocol

WORKER_STAGES = ("read", "decode", "transform", "map")  # seconds, in these columns of a worker's row
READ, DECODE, TRANSFORM, MAP = range(len(WORKER_STAGES))


class Laps(Protocol):
    """A stage clock as a decode uses it (fastload.workers.stage_clock.StageClock is one)."""

    def lap(self, stage: int) -> None: ...

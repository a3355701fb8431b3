"""Where a global step of an epoch ran. An epoch resumed (elastically) at other topologies ran in
segments: each of its ``resumed_from`` entries (world size, batch size, units consumed when it was
left, ...) one, then the current topology to the epoch's end; a global step is ``world_size *
batch_size`` units (samples, token rows) of its segment. :func:`step_at` is the one arithmetic
that finds a step's segment, for every kind of batch's ``describe``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fastload.orders.position import ResumedFrom


@dataclass(frozen=True)
class StepAt:
    """Global step ``first_step + index`` of an epoch: its segment, that segment's topology and
    the units consumed before it."""

    segment: int  # which topology: resumed_from[segment], or len(resumed_from) for the current one
    world_size: int
    batch_size: int
    rank_existed: bool  # whether the rank asked about was one of the segment's ranks
    first_step: int  # the epoch's global step the segment began with
    start: int  # units consumed when the segment began, counted in its order (0 where each segment's order starts anew)
    index: int  # the step's index within the segment

    @property
    def consumed(self) -> int:
        """Units consumed before the step, counted as :attr:`start` is."""
        return self.start + self.index * self.world_size * self.batch_size


def step_at(epoch: int, step: int, resumed_from: Sequence[ResumedFrom], world_size: int, batch_size: int, rank: int,
            held: Callable[[int, int], int] | None = None, restarts: bool = False) -> StepAt:
    """Where global ``step`` of ``epoch`` ran for ``rank``, the epoch resumed from ``resumed_from`` and now at
    (``world_size``, ``batch_size``). A left segment ran ceil((units consumed when left - its start) / its step's units)
    steps, at most ``held(segment, start)`` (the steps its order holds from ``start``; the current segment runs
    them all, and on for ever without ``held``); ``restarts``: each segment's order counts its units from 0 (the
    streaming order's re-deal), else they run on. An IndexError names a step past the epoch's end."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    first_step, start = 0, 0
    segments: list[tuple[int, int, int | None]] = [(world, batch, end) for world, batch, end, *_ in resumed_from]
    segments.append((world_size, batch_size, None))
    for segment, (world, batch, end) in enumerate(segments):
        start = 0 if restarts else start
        ran = None if held is None else held(segment, start)  # None: no end
        if end is not None:
            left = -(-(end - start) // (world * batch))  # its steps up to the units consumed when it was left
            ran = left if ran is None else min(ran, left)
        if ran is None or step < first_step + ran:
            return StepAt(segment, world, batch, rank < world, first_step, start, step - first_step)
        first_step += ran
        start = start if end is None else end
    raise IndexError(f"step {step} is past the end of epoch {epoch} ({first_step} steps)")

"""The topologies an epoch ran at, with their orders: the steps each segment's order held, which
:func:`~fastload.orders.steps.step_at` bounds a segment by, computed one way for ``describe`` and for
the global step a resumed loader numbers its batches with (``batch_map``'s generator, the samplers')."""

from __future__ import annotations

from collections.abc import Sequence

from fastload.orders.balanced import ClassMembers
from fastload.orders.epoch_order import EpochOrder
from fastload.orders.mixture_order import MixtureOrder
from fastload.orders.position import ResumedFrom
from fastload.orders.spec import OrderSpec
from fastload.orders.steps import StepAt, current_segment, step_at


class EpochSegments:
    """Epoch ``epoch`` resumed from ``resumed_from`` and now at ``spec``'s topology: each segment's spec
    (``topologies``) and order (computed when first asked)."""

    def __init__(self, spec: OrderSpec | MixtureOrder, resumed_from: Sequence[ResumedFrom], epoch: int,
                 classes: ClassMembers | None = None) -> None:
        self.spec, self.resumed_from, self.epoch, self.classes = spec, tuple(resumed_from), epoch, classes
        self.topologies = [spec.at_topology(w, b, self.resumed_from[:g]) for g, (w, b, *_) in enumerate(self.resumed_from)]
        self.topologies.append(spec.at_topology(spec.world_size, spec.batch_size, self.resumed_from))
        self._orders: dict[int, EpochOrder] = {}

    def order(self, segment: int) -> EpochOrder:
        """Segment ``segment``'s order of the epoch."""
        if segment not in self._orders:
            self._orders[segment] = self.topologies[segment].order(self.epoch, self.classes)
        return self._orders[segment]

    def held(self, segment: int, start: int) -> int:
        """The steps segment ``segment``'s order holds from position ``start`` (rank 0's batches: every rank has as many)."""
        at = self.topologies[segment]
        return len(at.at_topology(at.world_size, at.batch_size, (), rank=0).batches(len(self.order(segment)), start))

    def step_at(self, step: int) -> StepAt:
        """Where global ``step`` ran for the spec's rank."""
        spec = self.spec
        return step_at(self.epoch, step, self.resumed_from, spec.world_size, spec.batch_size, spec.rank, self.held,
                       restarts=spec.streaming)

    def current(self) -> StepAt:
        """The current topology's segment at its first step (only the left segments' orders computed)."""
        spec = self.spec
        return current_segment(self.resumed_from, spec.world_size, spec.batch_size, spec.rank, self.held,
                               restarts=spec.streaming)

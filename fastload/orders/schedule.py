"""Mixture weights that change over a run (:class:`WeightSchedule`), and which member each position
of the run takes under them, as pure functions of (seed, position).

A schedule's stages are ``(at, weights)``: ``at`` counts what the mixture delivers since the run's
start (samples for ``fastload.mix(by="samples")``, tokens for ``by="tokens"``), across its epochs,
so a position's weights are the same at any world size or batch size. Between two stages the
weights follow a straight line (``interpolate="linear"``) or hold the earlier stage's
(``"constant"``); before the first stage they are the first's, after the last the last's.

The run's positions are cut into *parts* (:class:`ScheduledParts`): at most ``cap`` units each
(16,384 samples; 2^22 tokens), at most 1/64 of the shortest stage, but at least 1/16,384 of the
last stage's ``at`` (the parts before it are computed one after another, once: about a second at
16,384 parts) and a row. How many positions of each member a part holds is the whole numbers
closest to the schedule's running total (each part is given what the members are owed by then,
the schedule's weights integrated over the run so far, rounded by largest remainder), so after
any part a member is within about a position of its scheduled total; past the last stage
(constant weights) a part's counts follow in closed form from its number. Within a part the
members' positions are spread evenly, or arranged by a seeded permutation (shuffle).
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.orders.mixing import MASK64, Leaf, apportion, spread_evenly

SCHEDULE_KEY = 0x5C4ED  # tags a scheduled part's arrangement
PARTS_KEPT = 4  # the most recent parts' arrangements kept
MOST_PARTS = 1 << 14  # the parts before the last stage (computed one after another, once) are at most these


@dataclass(frozen=True, init=False)
class WeightSchedule:
    """Mixture weights as a function of what the run has delivered: ``stages`` are ``(at, weights)``
    with ``at`` the samples (``mix(by="samples")``) or tokens (``by="tokens"``) consumed since the
    run's start, ascending, and ``weights`` one per member, in the members' order or keyed by the
    members as given to ``fastload.mix``; between stages ``interpolate="linear"`` or ``"constant"``."""

    at: tuple[int, ...]
    weights: tuple[tuple[float, ...], ...]
    interpolate: str
    keys: tuple[Any, ...] | None  # the members the weights were keyed by (None: in the members' order)

    def __init__(self, stages: Sequence[tuple[int, Sequence[float] | Mapping[Any, float]]], interpolate: str = "linear") -> None:
        if interpolate not in ("linear", "constant"):
            raise ValueError(f"WeightSchedule: interpolate must be 'linear' or 'constant', got {interpolate!r}")
        stages = list(stages)
        if not stages:
            raise ValueError("WeightSchedule: give at least one stage (at, weights)")
        keys = tuple(stages[0][1]) if isinstance(stages[0][1], Mapping) else None
        at: list[int] = []
        weights: list[tuple[float, ...]] = []
        for number, stage in enumerate(stages):
            if not isinstance(stage, (tuple, list)) or len(stage) != 2:
                raise ValueError(f"WeightSchedule: stage {number} must be a pair (at, weights), got {stage!r}")
            where, given = stage
            if not isinstance(where, numbers.Integral) or isinstance(where, bool) or where < 0 or (at and where <= at[-1]):
                raise ValueError(f"WeightSchedule: stage {number}'s at must be a whole number >= 0 above the previous stage's, got {where!r}")
            if isinstance(given, Mapping) != (keys is not None) or (keys is not None and set(given) != set(keys)):
                raise ValueError(f"WeightSchedule: stage {number} names other members than stage 0: every stage weighs the same members")
            values = [given[k] for k in keys] if keys is not None and isinstance(given, Mapping) else list(given)
            if any(not isinstance(w, numbers.Real) or isinstance(w, bool) or not math.isfinite(w) or w < 0 for w in values) \
                    or not sum(values) > 0 or len(values) != len(weights[0] if weights else values):
                raise ValueError(f"WeightSchedule: stage {number}'s weights must be as many as stage 0's, each a number >= 0, "
                                 f"not all 0, got {given!r}")
            at.append(int(where))
            weights.append(tuple(float(w) for w in values))
        object.__setattr__(self, "at", tuple(at))
        object.__setattr__(self, "weights", tuple(weights))
        object.__setattr__(self, "interpolate", interpolate)
        object.__setattr__(self, "keys", keys)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (the weights in the members' order once given to ``mix``): ``WeightSchedule(**d)`` makes it again."""
        return {"stages": [[a, list(w)] for a, w in zip(self.at, self.weights, strict=True)], "interpolate": self.interpolate}

    def for_members(self, members: Sequence[Any]) -> WeightSchedule:
        """This schedule with its weights in the order of ``members`` (the keys ``mix`` was given),
        a ValueError naming what does not match."""
        if self.keys is None:
            if len(self.weights[0]) != len(members):
                raise ValueError(f"mix: the schedule weighs {len(self.weights[0])} members, {len(members)} were given")
            return self
        missing = [m for m in members if m not in self.keys]
        if missing or len(self.keys) != len(members):
            raise ValueError(f"mix: the schedule's stages name other members than those given (not in the schedule: {missing!r})")
        order = [self.keys.index(m) for m in members]
        return WeightSchedule([(a, [w[i] for i in order]) for a, w in zip(self.at, self.weights, strict=True)], self.interpolate)

    def weights_at(self, at: float) -> tuple[float, ...]:
        """The weights in force after ``at`` samples (or tokens) of the run, summing to 1."""
        stage = int(np.searchsorted(self.at, at, side="right")) - 1
        if stage < 0:
            w = np.asarray(self.weights[0])
        elif stage == len(self.at) - 1 or self.interpolate == "constant":
            w = np.asarray(self.weights[stage])
        else:
            a, b = np.asarray(self.weights[stage]) / sum(self.weights[stage]), np.asarray(self.weights[stage + 1]) / sum(self.weights[stage + 1])
            t = (at - self.at[stage]) / (self.at[stage + 1] - self.at[stage])
            w = a + (b - a) * t
        return tuple(float(x) for x in w / w.sum())

    def mean_weights(self, start: float, end: float) -> np.ndarray:
        """The weights' mean over ``start`` to ``end`` samples (or tokens) of the run (summing to 1)."""
        cuts = [start, *(at for at in self.at if start < at < end), end]
        total = np.zeros(len(self.weights[0]))
        for lo, hi in itertools.pairwise(cuts):
            ends = np.asarray(self.weights_at(lo)) if self.interpolate == "constant" else np.asarray(self.weights_at(hi))
            total += (hi - lo) * (np.asarray(self.weights_at(lo)) + ends) / 2
        return total / (end - start)

    def parts(self, unit: int, cap: int) -> ScheduledParts:
        """The run's parts for positions of ``unit`` samples or tokens each, parts of at most ``cap`` of them."""
        return _parts(self, unit, cap)


@functools.lru_cache(maxsize=8)
def _parts(schedule: WeightSchedule, unit: int, cap: int) -> ScheduledParts:
    return ScheduledParts(schedule, unit, cap)


class ScheduledParts:
    """A schedule's parts of the run (see the module docstring): each part's counts of each member,
    the parts before the last stage computed once, those after it in closed form."""

    def __init__(self, schedule: WeightSchedule, unit: int, cap: int) -> None:
        gaps = np.diff(schedule.at)
        part_units = min(cap, int(gaps.min()) // 64 if len(gaps) else cap)
        part_units = max(part_units, -(-schedule.at[-1] // MOST_PARTS), unit)
        self.schedule, self.size = schedule, max(1, part_units // unit)
        self.scheduled = -(-schedule.at[-1] // (self.size * unit))  # parts before the last stage's weights hold for good
        counts = np.zeros((self.scheduled, len(schedule.weights[0])), dtype=np.int64)
        owed = np.zeros(counts.shape[1])
        for part in range(self.scheduled):  # each part gets what the members are owed, rounded
            owed += self.size * schedule.mean_weights(part * self.size * unit, (part + 1) * self.size * unit)
            counts[part] = apportion(self.size, tuple(np.maximum(owed, 0).tolist()))
            owed -= counts[part]
        self.before = np.concatenate([np.zeros((1, counts.shape[1]), dtype=np.int64), np.cumsum(counts, axis=0)])
        last = np.asarray(schedule.weights_at(schedule.at[-1]))
        self.last = last
        # past the last stage: parts large enough that a member's cumulative rounding never steps back (size * weight >= 2)
        self.tail_size = self.size * max(1, math.ceil(2 / (self.size * last[last > 0].min())))
        # by (part, seed, shuffle); one ScheduledParts serves every loader of the schedule (DALI's feeding thread too),
        # so the kept parts are only read, set and cleared: each one step under the GIL, no lock held across a fork
        self._kept: dict[tuple[int, int, bool], Leaf] = {}

    def _tail_before(self, part: int) -> np.ndarray:
        return self.before[-1] + np.asarray(apportion(part * self.tail_size, tuple(self.last.tolist())), dtype=np.int64)

    def part(self, position: int, seed: int, shuffle: bool) -> Leaf:
        """The part holding run position ``position`` (the latest few kept)."""
        boundary = self.scheduled * self.size
        number = position // self.size if position < boundary else self.scheduled + (position - boundary) // self.tail_size
        found = self._kept.get((number, seed, shuffle))
        if found is not None:
            return found
        if number < self.scheduled:
            start, before, counts = number * self.size, self.before[number], self.before[number + 1] - self.before[number]
        else:
            tail = number - self.scheduled
            start, before = boundary + tail * self.tail_size, self._tail_before(tail)
            counts = self._tail_before(tail + 1) - before
        if shuffle:
            rng = np.random.Generator(np.random.PCG64([seed & MASK64, number, SCHEDULE_KEY]))
            members = rng.permutation(np.repeat(np.arange(len(counts), dtype=np.int64), counts))
        else:
            members = spread_evenly(counts)
        found = Leaf(start, before, members)
        if len(self._kept) >= PARTS_KEPT:
            self._kept.clear()
        self._kept[(number, seed, shuffle)] = found
        return found

    def members(self, positions: np.ndarray, seed: int, shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
        """Of each run position: its member and how many of that member's positions come before it in the run."""
        positions = np.asarray(positions, dtype=np.int64)
        member_at, taken = np.empty(len(positions), dtype=np.int64), np.empty(len(positions), dtype=np.int64)
        by_position = np.argsort(positions, kind="stable")
        ordered = positions[by_position]
        first = 0
        while first < len(positions):
            part = self.part(int(ordered[first]), seed, shuffle)
            last = int(np.searchsorted(ordered, part.start + len(part.members)))
            chosen = by_position[first:last]
            local = positions[chosen] - part.start
            member_at[chosen] = part.members[local]
            taken[chosen] = part.before[part.members[local]] + part.ranks()[local]
            first = last
        return member_at, taken

    def before_position(self, position: int, seed: int, shuffle: bool) -> np.ndarray:
        """Each member's positions before run position ``position``."""
        part = self.part(position, seed, shuffle)
        return part.before + np.bincount(part.members[: position - part.start], minlength=len(part.before))

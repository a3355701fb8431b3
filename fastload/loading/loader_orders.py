"""A loader's epoch orders and this rank's batches at any training position: pure functions of
the options, the dataset's shard sizes, rank and world size (read when asked) and the position.
:class:`~fastload.orders.spec.OrderSpec` holds them as plain values; :class:`LoaderOrders` is one
loader's; ``exclude=`` is read here."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from fastload._util.dist import resolve_rank_world
from fastload.formats.key_list import parse_keys
from fastload.loading.loader_options import LoaderOptions
from fastload.orders.balanced import ClassMembers, class_members, class_weight_vector
from fastload.orders.epoch_order import EpochOrder
from fastload.orders.mixture_order import MemberPosition, MixtureOrder
from fastload.orders.position import Position, ResumedFrom
from fastload.orders.rank_batches import RankBatches
from fastload.orders.segments import EpochSegments
from fastload.orders.spec import OrderSpec
from fastload.orders.steps import StepAt
from fastload.storage.dataset import ShardedDataset
from fastload.storage.mixed_dataset import MixedDataset


def read_exclude(exclude: Sequence[str] | str | os.PathLike[str]) -> list[str]:
    """The keys of ``exclude=``: a sequence of keys, or a path to a UTF-8 file of one key per line
    (as ``fastload overlap --write-exclude`` writes: fastload.formats.key_list; blank lines ignored)."""
    if not isinstance(exclude, (str, os.PathLike)):
        return [str(key) for key in exclude]
    path = Path(exclude)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"exclude=: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"exclude=: {path} is not UTF-8 text (one key per line)") from None
    return parse_keys(text, f"exclude=: {path}")


def excluded_indices(dataset: ShardedDataset, exclude: Sequence[str] | str | os.PathLike[str] | None) -> tuple[int, ...] | None:
    """The sorted indices of every sample holding one of ``exclude=``'s keys (a key repeated across
    shards: all of them); a key the dataset lacks is refused by name."""
    if exclude is None:
        return None
    try:
        indices = dataset.indices_holding(read_exclude(exclude))
    except KeyError as exc:
        raise KeyError(f"exclude=: {exc.args[0]}") from None  # the dataset's error names it and the key
    return tuple(indices.tolist())


class LoaderOrders:
    """The orders of one loader, the current epoch's cached (every backend and the sampler views
    read the same one)."""

    def __init__(self, dataset: ShardedDataset, options: LoaderOptions) -> None:
        self.shard_sizes = tuple(dataset.index.shard_samples().tolist())
        self.options = options
        self.mixture = dataset if isinstance(dataset, MixedDataset) else None
        self.ramp = self.mixture is None and dataset.layout.in_place  # a first batch reads few row groups (OrderSpec.ramp)
        if self.mixture is not None:
            refuse_for_mixture(options)
        self._cached: tuple[tuple[int, OrderSpec | MixtureOrder], EpochOrder] | None = None
        self._segment: tuple[tuple[int, tuple[ResumedFrom, ...]], StepAt] | None = None  # an elastically resumed epoch's current segment
        self.classes: ClassMembers | None = None  # the class-balanced order's samples by label
        self.class_weights: tuple[float, ...] | None = None
        if options.balanced or options.class_weights is not None:
            labels = dataset.sample_labels()
            count = len(dataset.classes) if dataset.classes is not None else None
            self.classes = class_members(labels, self._spec(0, 1, ()).selection(), count)
            self.class_weights = class_weight_vector(options.class_weights, self.classes.counts, dataset.classes, self.classes.labels)

    def ranks(self) -> tuple[int, int]:
        """(rank, world size): rank=/world_size=, a DistributedSampler's, the process group's, the launcher's."""
        return resolve_rank_world(self.options.rank, self.options.world_size)

    def spec(self, resumed_from: tuple[ResumedFrom, ...] = ()) -> OrderSpec | MixtureOrder:
        """What the orders depend on, as plain values (DALI's workers get a copy)."""
        spec = self._spec(*self.ranks(), resumed_from)
        return spec if self.mixture is None else self.mixture.order(spec)

    def _spec(self, rank: int, world: int, resumed_from: tuple[ResumedFrom, ...]) -> OrderSpec:
        options = self.options
        return OrderSpec(
            self.shard_sizes, options.seed, options.shuffle, options.batch_size, rank, world,
            options.drop_last, options.streaming, options.buffer_size, resumed_from, options.take, options.drop_remainder,
            options.exclude or (), self.class_weights, self.ramp,
        )

    def order(self, position: Position) -> EpochOrder:
        """The order of the position's epoch (the same for every backend)."""
        spec = self.spec(position.resumed_from)
        if self._cached is None or self._cached[0] != (position.epoch, spec):
            self._cached = ((position.epoch, spec), spec.order(position.epoch, self.classes))
        return self._cached[1]

    def batches(self, position: Position) -> RankBatches:
        """This rank's batches from the position to the end of its epoch, numbered by the epoch's global steps
        as ``describe`` numbers them (after an elastic resume: the left topologies' steps, then these)."""
        plan = self.spec(position.resumed_from).batches(len(self.order(position)), position.consumed)
        if not position.resumed_from:
            return plan
        key = (position.epoch, position.resumed_from)
        if self._segment is None or self._segment[0] != key:
            self._segment = (key, EpochSegments(self.spec(), position.resumed_from, position.epoch, self.classes).current())
        segment = self._segment[1]
        return replace(plan, first_step=segment.first_step + (plan.start - segment.start) // plan.step)

    def member_positions(self, position: Position) -> tuple[MemberPosition, ...]:
        """Where each member of a mixture is at ``position``."""
        spec = self.spec(position.resumed_from)
        assert isinstance(spec, MixtureOrder), "only a mixture has members"
        return spec.member_positions(position.epoch, position.consumed)

    def weights_at(self, position: Position) -> tuple[float, ...]:
        """The weights of a mixture's members in force at ``position`` (summing to 1)."""
        spec = self.spec(position.resumed_from)
        assert isinstance(spec, MixtureOrder), "only a mixture has members"
        return spec.weights_at(position.epoch, position.consumed)

    def remainder(self, position: Position) -> int:
        """Real samples in the epoch's last global batch, as accelerate's ``remainder``: 0 when
        every global batch is full, -1 when padding is not at the end (the streaming order)."""
        if self.options.streaming:
            return -1
        if self.options.drop_last:
            return 0
        return len(self.order(position)) % self.batches(position).step


def refuse_for_mixture(options: LoaderOptions) -> None:
    """A ValueError naming the option a mixture's order cannot follow, if one was given."""
    if options.take is not None:
        raise ValueError("a Subset (or SubsetRandomSampler) of a mixture: give mix() the members' own datasets instead")
    if options.shuffle_buffer is not None:
        raise ValueError("shuffle_buffer= (the streaming order) with a mixture: its remote members already read their "
                         "shards in sequence (fastload.orders.mixture_order)")
    if options.evaluation:
        raise ValueError("evaluation= reads every sample once, and a weighted mixture has no such pass: evaluate each member on its own")
    if options.drop_remainder:
        raise ValueError("a DistributedSampler(drop_last=True) with a mixture: give drop_last=True to the loader instead")
    if options.exclude is not None:
        raise ValueError("exclude= with a mixture: not yet; leave the keys out of the members' own datasets")
    if options.balanced or options.class_weights is not None:
        raise ValueError("class_weights=/balanced= with a mixture: the mixture's weights already set each member's share")

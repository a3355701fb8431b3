"""``fastload.mix``: several converted datasets sampled with given weights, as one dataset.

A :class:`MixedDataset` is a sharded dataset whose shards are its members' shards, concatenated:
sample indices run through member 0, then member 1, and so on. Its loader draws them in the
mixture's own order (fastload.orders.mixture_order). A sample's key is the member's number in the
mixture, a slash, and the member's own key (``"1/000042"``): :meth:`MixedDataset.member_key`
splits it again.
"""

from __future__ import annotations

import bisect
import itertools
import math
import numbers
import os
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from fastload.fields import default_role
from fastload.formats.index import FORMAT_VERSION, DatasetIndex
from fastload.formats.part_table import PartTable
from fastload.formats.shard_reader import ShardReader
from fastload.formats.table import SampleTable
from fastload.orders.epoch_order import shards_of
from fastload.orders.mixing import apportion
from fastload.orders.mixture_order import MEMBER_BUFFER, MemberPosition, MixtureOrder
from fastload.orders.schedule import WeightSchedule
from fastload.orders.spec import OrderSpec
from fastload.storage.dataset import ShardedDataset, open_shards_each

Member = str | os.PathLike[str] | ShardedDataset


def compatible_index(members: tuple[ShardedDataset, ...], by: str) -> DatasetIndex:
    """One index describing every member's shards, after checking the members hold the same
    fields (and image fields, decoded pixel shape, class names); else a ValueError naming the member.
    Where a member is read in place (its fields are its columns' names; a converted dataset's are
    ``jpg`` and ``cls``) and the names differ, the members mix when each holds images and all or
    none labels: the mixture's samples are the classic ones (:attr:`MixedDataset.classic_names`),
    its fields those all share. Mixed ``by="tokens"``, only the token datasets' tokenizers are
    checked (a member read in place is checked by the loader, against the ``tokenizer=`` it reads the member with)."""
    in_place = any(m.layout.in_place for m in members)
    if by == "tokens":
        check_tokenizers(members)
        return joined_index(members) if in_place else concatenated_index(members)
    first = members[0].index
    same_names = all(sorted(m.index.fields) == sorted(first.fields) and m.index.columns == first.columns for m in members)
    classic = not same_names and in_place  # only the classic sample is common to all
    for number, member in enumerate(members[1:], start=1):
        index = member.index
        checks: list[tuple[str, object, object]] = [("decoded pixel shape", index.decoded_shape, first.decoded_shape)]
        if classic:
            checks += [("images", bool(index.image_fields), bool(first.image_fields)), ("labels", member.has_labels, members[0].has_labels)]
        else:
            checks[:0] = [("fields", sorted(index.fields), sorted(first.fields)), ("image fields", sorted(index.image_fields), sorted(first.image_fields))]
        for what, mine, theirs in checks:
            if mine != theirs:
                raise ValueError(f"mix: member {number} ({member.location}) has {what} {mine}, member 0 "
                                 f"({members[0].location}) has {theirs}: members must hold the same fields")
        if None not in (index.classes, first.classes) and index.classes != first.classes:
            raise ValueError(f"mix: member {number} ({member.location}) names its classes differently from member 0 "
                             f"({members[0].location}): one label would mean two classes")
    if classic and not first.image_fields:
        raise ValueError(f"mix: member 0 ({members[0].location}) names its fields unlike the others and holds no images "
                         "(the one sample they could share): members must hold the same fields")
    image_fields = first.image_fields if not classic else tuple(dict.fromkeys(f for m in members for f in m.index.image_fields))
    return joined_index(members, image_fields) if in_place else concatenated_index(members)


def check_tokenizers(members: tuple[ShardedDataset, ...]) -> None:
    """A ValueError naming the first token dataset among ``members`` not tokenized with the first one's tokenizer."""
    tokenized = [(number, member, tokenizer.sha256) for number, member in enumerate(members) if (tokenizer := member.index.tokenizer)]
    if not tokenized:
        return
    first_number, first, first_sha256 = tokenized[0]
    for number, member, sha256 in tokenized[1:]:
        if sha256 != first_sha256:
            raise ValueError(f"mix: member {number} ({member.location}) was not tokenized with member {first_number}'s tokenizer "
                             f"({first.location}): one id would mean two tokens")


def shared_fields(members: tuple[ShardedDataset, ...]) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """(the fields every member holds, in the first member's order; the class names of the first member naming them)."""
    fields = tuple(f for f in members[0].index.fields if all(f in m.index.fields for m in members))
    return fields, next((m.index.classes for m in members if m.index.classes is not None), None)


def concatenated_index(members: tuple[ShardedDataset, ...]) -> DatasetIndex:
    """The index of converted members: their shards one after another, in the first member's layout."""
    first = members[0].index
    fields, classes = shared_fields(members)
    shards = tuple(itertools.chain.from_iterable(m.index.shards for m in members))
    return DatasetIndex(first.layout, shards, fields, classes, image_fields=first.image_fields, decoded_shape=first.decoded_shape,
                        tokenizer=first.tokenizer, version=first.version if first.tokenizer is not None else FORMAT_VERSION)


def joined_index(members: tuple[ShardedDataset, ...], image_fields: tuple[str, ...] = ()) -> DatasetIndex:
    """The index of members of which one is read in place, in its layout: the members' parts one table (a converted
    member's shards as whole files), so a member of a million row groups makes no object each; each member reads
    through its own index."""
    fields, classes = shared_fields(members)
    in_place = next(m.index for m in members if m.layout.in_place)
    parts = PartTable.joined([m.index.shards if isinstance(m.index.shards, PartTable) else PartTable.of_whole(m.index.shards) for m in members])
    columns = {name: role for m in members for name, role in m.index.columns.items()}
    return DatasetIndex(in_place.layout, parts, fields, classes, image_fields=image_fields, columns=columns, version=in_place.version)


class MixedDataset(ShardedDataset):
    """Members sampled with weights; see the module docstring. One *epoch* of a mixture is
    ``samples_per_epoch`` samples (default: the members' sizes summed), of which member m gives
    its weight's share exactly; each member runs through its own epochs, reshuffled, meanwhile."""

    def __init__(self, members: tuple[ShardedDataset, ...], weights: tuple[float, ...], samples_per_epoch: int,
                 by: str = "samples", schedule: WeightSchedule | None = None) -> None:
        self.members, self.weights, self.samples_per_epoch, self.by = members, weights, samples_per_epoch, by
        self.schedule = schedule  # weights that change over the run; ``weights`` are then its first stage's
        self.counts = apportion(samples_per_epoch, weights)
        self.index = compatible_index(members, by)
        self.url, self.root, self.cache = None, None, None  # remote members fetch through their own caches
        self._offsets = list(itertools.accumulate((len(m) for m in members), initial=0))
        self._first_shards = list(itertools.accumulate((len(m.index.shards) for m in members), initial=0))
        self._starts = list(itertools.accumulate(self.index.shard_samples().tolist(), initial=0))

    def __len__(self) -> int:
        return self._offsets[-1]

    def __repr__(self) -> str:
        parts = ", ".join(f"{m.location!r}: {w:g}" for m, w in zip(self.members, self.weights, strict=True))
        scheduled = f", weights={self.schedule.as_dict()}" if self.schedule is not None else ""
        return f"fastload.mix({{{parts}}}{scheduled}): {self.samples_per_epoch} samples an epoch of {len(self)}"

    @property
    def streams(self) -> bool:
        """False: a mixture's own order is global; each member keeps its own (a remote member's and
        data read in place stream: :class:`~fastload.orders.mixture_order.MixtureOrder`)."""
        return False

    @property
    def shuffle_window(self) -> int | None:
        """None: a mixture takes no streaming buffer of its own (its members' are theirs)."""
        return None

    @property
    def has_labels(self) -> bool:
        """Whether every member's samples carry a label."""
        return all(m.has_labels for m in self.members)

    @property
    def classic_names(self) -> tuple[str, str]:
        """(image, label) stored names of the classic sample: each member's, as alternatives."""
        return tuple(";".join(dict.fromkeys(alt for m in self.members for alt in m.classic_names[at].split(";")))  # type: ignore[return-value]
                     for at in range(2))

    def role(self, field: str) -> str:
        """The role of stored field ``field``: the first member's that reads it in place, else its extension's default."""
        return next((m.role(field) for m in self.members if field in m.index.columns), default_role(field))

    def __getitem__(self, i: int) -> dict[str, Any]:
        """Sample ``i`` as its member gives it (``ds[i]``), its key prefixed by the member's number."""
        member, local = self.member_of(i)
        sample = self.members[member][local]
        return {**sample, "key": f"{member}/{sample['key']}"}

    @property
    def first_shards(self) -> list[int]:
        """Each member's first shard among all members' shards, then their count."""
        return self._first_shards

    @property
    def location(self) -> str:
        """The members' locations, as errors name the mixture."""
        return "mix(" + ", ".join(m.location for m in self.members) + ")"

    def member_of(self, i: int) -> tuple[int, int]:
        """(member number, index in the member) of sample ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        member = bisect.bisect_right(self._offsets, i) - 1
        return member, i - self._offsets[member]

    @staticmethod
    def member_key(key: str) -> tuple[int, str]:
        """(member number, the member's own key) of a key this mixture gave."""
        number, _, own = key.partition("/")
        return int(number), own

    def locate(self, i: int) -> tuple[int, int]:
        """(shard number among all members' shards, row in shard) of sample ``i``."""
        member, local = self.member_of(i)
        shard, row = self.members[member].locate(local)
        return self._first_shards[member] + shard, row

    def shards_of(self, indices: np.ndarray) -> np.ndarray:
        """Shard number (among all members' shards) of each sample index."""
        return shards_of(self._starts, indices)

    def _member_shard(self, shard: int) -> tuple[ShardedDataset, int]:
        member = bisect.bisect_right(self._first_shards, shard) - 1
        return self.members[member], shard - self._first_shards[member]

    def reader(self, shard: int) -> ShardReader:
        """The reader of shard number ``shard`` (among all members' shards), the member's own."""
        member, local = self._member_shard(shard)
        return member.reader(local)

    @property
    def downloads(self) -> bool:
        """Whether a member is remote."""
        return any(m.url is not None for m in self.members)

    def is_remote(self, shard: int) -> bool:
        """Whether shard number ``shard`` (among all members' shards) belongs to a remote member."""
        member, _ = self._member_shard(shard)
        return member.url is not None

    def fetch(self, shard: int) -> tuple[Path, Path | None]:
        """Local paths of a remote member's shard, as :meth:`ShardedDataset.fetch`."""
        member, local = self._member_shard(shard)
        return member.fetch(local)

    def substitute(self, i: int, offset: int) -> int:
        """The sample ``offset`` places after ``i`` within its member (wrapping there), so a skipped
        sample is replaced from its own member and the weights hold."""
        member, local = self.member_of(i)
        return self._offsets[member] + (local + offset) % len(self.members[member])

    def shard_name(self, shard: int) -> str:
        """'<member location>/shard-00003.tar': shard number ``shard`` among all members' shards."""
        member, local = self._member_shard(shard)
        return f"{member.location}/{member.shard_name(local)}"

    def key_of(self, i: int) -> str:
        """The key of sample ``i``, prefixed by its member's number (as :meth:`raw` gives it)."""
        member, local = self.member_of(i)
        return f"{member}/{self.members[member].key_of(local)}"

    def table(self, shard: int) -> SampleTable:
        """The sample table of shard number ``shard`` (among all members' shards): its member's."""
        member, local = self._member_shard(shard)
        return member.table(local)

    def sample_keys(self) -> Sequence[str]:
        """Every sample's key (member-prefixed) by index: a view reading the members' tables as asked."""
        return MixtureKeys(self)

    def _keys_by_member(self, keys: list[str]) -> dict[int, tuple[list[int], list[str]]]:
        """Member number -> (places in ``keys``, the member's own keys) of ``"member/key"`` keys;
        a KeyError names one of another form."""
        by_member: dict[int, tuple[list[int], list[str]]] = {}
        for at, key in enumerate(keys):
            number, _, own = key.partition("/")
            if not number.isdigit() or int(number) >= len(self.members) or not own:
                raise KeyError(f"{key!r}: not a key of {self.location} (keys are 'member/key', members 0..{len(self.members) - 1})")
            places, own_keys = by_member.setdefault(int(number), ([], []))
            places.append(at)
            own_keys.append(own)
        return by_member

    def indices_of(self, keys: Iterable[str]) -> np.ndarray:
        """The index of each of ``keys`` (``"member/key"``, as this mixture gives them), in their
        order; a KeyError names the first key no member has."""
        keys = list(keys)
        out = np.empty(len(keys), dtype=np.int64)
        for member, (places, own_keys) in self._keys_by_member(keys).items():
            out[places] = self.members[member].indices_of(own_keys) + self._offsets[member]
        return out

    def indices_holding(self, keys: Iterable[str]) -> np.ndarray:
        """The sorted indices of every sample holding one of ``keys`` (``"member/key"``)."""
        parts = [self.members[member].indices_holding(own_keys) + self._offsets[member]
                 for member, (_, own_keys) in self._keys_by_member(list(keys)).items()]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)

    def where(self, i: int) -> str:
        """'<member location>/shard-00003.tar:key' — how errors name a sample."""
        member, local = self.member_of(i)
        return f"{self.members[member].location}/{self.members[member].where(local)}"

    def raw(self, i: int, fields: Collection[str] | None = None) -> tuple[str, dict[str, bytes], np.ndarray | None]:
        """(key prefixed by the member's number, encoded fields, decoded pixels or None) of sample
        ``i``; only the fields named in ``fields`` when given."""
        member, local = self.member_of(i)
        key, stored, pixels = self.members[member].raw(local, fields)
        return f"{member}/{key}", stored, pixels

    def order(self, loader: OrderSpec) -> MixtureOrder:
        """The mixture's orders for a loader whose own orders would be ``loader``'s."""
        buffers = tuple((m.shuffle_window or MEMBER_BUFFER) if m.streams else 0 for m in self.members)
        return MixtureOrder(loader, tuple(tuple(m.index.shard_samples().tolist()) for m in self.members), self.counts, buffers, self.schedule)

    def describe_positions(self, positions: tuple[MemberPosition, ...], weights: tuple[float, ...] | None = None) -> list[dict]:
        """Each member's position as a state_dict records it (location, weight: ``weights``, those in
        force, else the mixture's own, epoch, samples consumed)."""
        return [{"dataset": m.location, "weight": w, "epoch": p.epoch, "samples_consumed": p.consumed}
                for m, w, p in zip(self.members, weights or self.weights, positions, strict=True)]

    def identity(self) -> str:
        """What of the mixture decides its order beyond its shards, for the loaders' identity digests:
        each member's positions an epoch (the weights and epoch length), and the schedule."""
        return f"mix{self.counts}" + (f"{self.schedule.as_dict()}" if self.schedule is not None else "")

    def close(self) -> None:
        """Close this process's shard files of every member."""
        for member in self.members:
            member.close()


def mix(members: Mapping[Member, float] | Sequence[Member], samples_per_epoch: int | None = None, by: str = "samples",
        weights: WeightSchedule | None = None) -> MixedDataset:
    """Datasets (paths, URLs or opened datasets) sampled with the given weights, as one dataset for
    ``fastload.DataLoader``; an epoch is ``samples_per_epoch`` samples (default: all members' sizes).
    ``by="tokens"``: token datasets, each weight a share of the rows (hence of the tokens) delivered,
    spread evenly (fastload.orders.mixing.mixture_members). ``weights``: a WeightSchedule, weights
    that change over the run (then ``members`` is a list). Members given as paths or URLs split
    the process's open-shard cap between them."""
    if not members:
        raise ValueError("mix: give at least one dataset and its weight")
    if by not in ("samples", "tokens"):
        raise ValueError(f"mix: by must be 'samples' or 'tokens', got {by!r}")
    if weights is not None and not isinstance(weights, WeightSchedule):
        raise ValueError(f"mix: weights= must be a fastload.WeightSchedule, got {type(weights).__name__}")
    if isinstance(members, Mapping) == (weights is not None) or isinstance(members, (str, os.PathLike)):
        raise ValueError("mix: give either {dataset: weight, ...}, or a list of datasets and weights=fastload.WeightSchedule(...)")
    weighed: Mapping[Member, float]
    if weights is not None:
        if len(set(members)) != len(members):
            raise ValueError("mix: a dataset is listed twice: give each once, the schedule its weight")
        weights = weights.for_members(list(members))
        weighed = dict(zip(members, weights.weights[0], strict=True))
    else:
        weighed = cast(Mapping[Member, float], members)
    opened: list[ShardedDataset] = []
    for member, weight in weighed.items():
        if isinstance(member, MixedDataset):
            raise ValueError(f"mix: {member.location} is a mixture itself: give its members, their weights multiplied")
        dataset = member if isinstance(member, ShardedDataset) else ShardedDataset(member, max_open_shards=open_shards_each(len(members)))
        if weights is None and (not isinstance(weight, numbers.Real) or isinstance(weight, bool) or not math.isfinite(weight) or weight <= 0):
            raise ValueError(f"mix: the weight of {dataset.location} must be a positive number, got {weight!r}")
        if not len(dataset):
            raise ValueError(f"mix: {dataset.location} holds no samples")
        opened.append(dataset)
    total = sum(len(d) for d in opened) if samples_per_epoch is None else samples_per_epoch
    if not isinstance(total, numbers.Integral) or isinstance(total, bool) or total < 1:
        raise ValueError(f"mix: samples_per_epoch must be a positive integer, got {samples_per_epoch!r}")
    for number, dataset in enumerate(opened):
        tokens = dataset.index.tokenizer is not None
        if by == "samples" and tokens:
            raise ValueError(f"mix: member {number} ({dataset.location}) holds tokens: token datasets are mixed by='tokens'")
        if by == "tokens" and not (tokens or dataset.layout.in_place):
            raise ValueError(f"mix: member {number} ({dataset.location}) holds neither tokens nor data read in place: by='tokens' "
                             "mixes token datasets and columns of token ids or text read in place")
    return MixedDataset(tuple(opened), tuple(float(w) for w in weighed.values()), int(total), by, weights)


class MixtureKeys(Sequence[str]):
    """A mixture's keys by index (``"member/key"``), read from the members' tables as asked."""

    def __init__(self, mixture: MixedDataset) -> None:
        self._mixture = mixture

    def __len__(self) -> int:
        return len(self._mixture)

    def __getitem__(self, i: int) -> str:  # type: ignore[override]  # int only, as the members' views
        if not isinstance(i, int):
            raise TypeError("sample keys are indexed by one int")
        return self._mixture.key_of(i % len(self) if -len(self) <= i < 0 else i)

    def __iter__(self) -> Iterator[str]:
        for number, member in enumerate(self._mixture.members):
            yield from (f"{number}/{key}" for key in member.sample_keys())

"""Which samples were in a training step, with which augmentation: ``loader.describe(step)``.

A batch is a pure function of (dataset, seed, epoch, rank, topology, step), and a sample's crop and
flip of (seed, epoch, index) and its image's size. So a step is described without decoding
anything: the order gives the indices, the shard indexes the keys, and for each encoded image
only its header is read (a ``pread`` of the first HEAD_BYTES of a tar member, more only when
the size marker lies further in; HDF5 shards read the sample's fields whole) to plan the crop
exactly as a worker does. After an elastic resume the steps run before it are described at the
topology (world size, batch size) they ran at, from the topologies the state was resumed from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from dataclasses import field as dataclass_field
from dataclasses import fields as dataclass_fields
from functools import partial
from typing import Any

import numpy as np

from fastload.decode.cpu import turbo
from fastload.decode.header import image_size, jpeg_size, png_size, sniff_image_format
from fastload.errors import SampleError
from fastload.fields import DECODED_FIELD, SampleSpec
from fastload.formats.wds.reader import TarShardReader
from fastload.media import MEDIA_ROLES
from fastload.orders.balanced import ClassMembers
from fastload.orders.mixture_order import MixtureOrder
from fastload.orders.position import ResumedFrom
from fastload.orders.segments import EpochSegments
from fastload.orders.spec import OrderSpec
from fastload.storage.dataset import ShardedDataset
from fastload.transforms import Plan, Transform, plan
from fastload.workers.rng import sample_rng

HEAD_BYTES = 4096  # an image's first read; a JPEG whose size marker lies further (big EXIF) is read 4x more at a time


@dataclass(frozen=True)
class SampleDescription:
    """One sample of a batch: where it is, and the geometry the workers apply to it."""

    index: int  # the sample's global index in the dataset
    key: str
    shard: str
    valid: bool  # False: padding that evens out the ranks' batches
    source_size: tuple[int, int] | None = None  # (height, width) of the stored image
    box: tuple[float, float, float, float] | None = None  # crop (x0, y0, x1, y1) in source pixels
    size: tuple[int, int] | None = None  # output (height, width)
    flip: bool = False
    dct_scale: str | None = None  # libjpeg-turbo's decode scale ("1/8" .. "1"); None: not a JPEG decoded by it
    bytes_read: int = 0  # what describing it read from the shard
    problem: str | None = None  # why it could not be planned (the workers would raise, or skip it)
    # media role -> its part of the description, named by its row of fastload.media (``described``): video's
    # ``video`` (the field its clips come from) and ``clips`` (each clip's first and last frame, and their times in
    # seconds), audio's ``audio`` and ``crops`` (each crop's start and end in seconds); read as attributes
    # (``sample.clips``), and in as_dict() in their place here, a role the sample lacks by its defaults
    media: Mapping[str, Mapping[str, Any]] = dataclass_field(default_factory=dict)
    stands_in_for: tuple[tuple[str, str], ...] = ()  # on_error="skip": (where, reason) of the bad samples whose place it took

    def described(self, role: str) -> dict[str, Any]:
        """Media ``role``'s part of the description, each of its names (fastload.media's ``described``) with its default where the sample has none."""
        own = self.media.get(role, {})
        return {name: own.get(name, default) for name, default in MEDIA_ROLES[role].described}

    def __getattr__(self, name: str) -> Any:
        """A media role's part of the description by its name (``sample.crops``; the role's default where it has none)."""
        if not name.startswith("_") and name != "media":
            for role, media in MEDIA_ROLES.items():
                if any(described == name for described, _ in media.described):
                    return self.described(role)[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def as_dict(self) -> dict[str, Any]:
        """Plain values, for JSON: its fields, each media role's part (:meth:`described`) in ``media``'s place."""
        plain = {key: value for key, value in asdict(self).items() if key not in ("media", "stands_in_for")}
        for role in MEDIA_ROLES:
            plain.update(self.described(role))
        return {**plain, "stands_in_for": self.stands_in_for}

    @property
    def where(self) -> str:
        """'shard:key', as errors and skip reports name the sample (a key of data read in place
        already names its file: then the key alone)."""
        return self.key if self.key.startswith(f"{self.shard}:") else f"{self.shard}:{self.key}"


SAMPLE_FIELDS = frozenset(f.name for f in dataclass_fields(SampleDescription))  # a media role's describe may set these


@dataclass(frozen=True)
class StepDescription:
    """A rank's batch at one step of an epoch, and the topology that step ran at."""

    epoch: int
    step: int  # the step within the epoch, counted from its start over every topology it ran at
    rank: int
    world_size: int
    batch_size: int
    samples: tuple[SampleDescription, ...]
    weights: tuple[float, ...] | None = None  # a mixture's: its members' weights in force at the batch's first sample

    def as_dict(self) -> dict[str, Any]:
        """Plain values, for JSON."""
        plain = asdict(self)
        plain["samples"] = [sample.as_dict() for sample in self.samples]
        return plain

    @property
    def keys(self) -> list[str]:
        """The samples' keys, in batch order."""
        return [sample.key for sample in self.samples]


@dataclass(frozen=True)
class StepBatch:
    """The sample indices of one step's batch and the topology it ran at."""

    indices: np.ndarray
    valid: np.ndarray
    world_size: int
    batch_size: int
    position: int  # the first position of the batch in the epoch's order


def step_batch(spec: OrderSpec | MixtureOrder, resumed_from: Sequence[ResumedFrom], epoch: int, step: int, classes: ClassMembers | None = None) -> StepBatch:
    """This rank's batch at ``step`` of ``epoch`` (``spec``: the current topology; ``resumed_from``:
    the topologies the epoch was resumed from as (world size, batch size, samples consumed) when it left them;
    ``classes``: as the class-balanced order needs)."""
    segments = EpochSegments(spec, resumed_from, epoch, classes)
    found = segments.step_at(step)
    if not found.rank_existed:
        raise ValueError(f"rank {spec.rank} did not exist at steps {found.first_step}.. of epoch {epoch} (world size {found.world_size})")
    order = segments.order(found.segment)
    plan_ = segments.topologies[found.segment].batches(len(order), found.start)
    positions = plan_.positions(found.index)
    return StepBatch(order.indices(positions), plan_.valid(found.index, order), found.world_size, found.batch_size, int(positions[0]) if len(positions) else len(order))


def turbo_scale(plan_: Plan) -> str:
    """The DCT scale libjpeg-turbo decodes a JPEG crop at: the smallest of 1/8, 1/4, 1/2, 1 keeping
    the crop at least the output's size (as ``fastload/decode/_turbo.c: decode_crop`` chooses it)."""
    x0, y0, x1, y1 = plan_.box
    need = max(plan_.size[0] / (y1 - y0), plan_.size[1] / (x1 - x0))
    m = 1
    while m < 8 and m < need * 8 - 1e-9:
        m *= 2
    return "1" if m == 8 else f"1/{8 // m}"


def _image_head(ds: ShardedDataset, index: int, spec: SampleSpec) -> tuple[bytes, int, bool]:
    """(the primary image's first bytes, bytes read, whether they are all of it): a tar member's
    header only (grown until its size can be read), an HDF5 sample's fields whole."""
    shard, row = ds.locate(index)
    reader = ds.reader(shard)
    assert spec.primary is not None  # only called for specs with an image
    where = ds.where(index)
    if isinstance(reader, TarShardReader):
        spans = reader.spans(row)
        name = spec.primary.find(spans)
        if name is None:
            raise SampleError(where, f"no image field among {sorted(spans)}")
        total, read, size = spans[name][1], 0, HEAD_BYTES
        while True:
            head = reader.read_head(row, name, size)
            read += len(head)
            fmt = sniff_image_format(head)
            sized = jpeg_size(head) if fmt == "jpg" else png_size(head) if fmt == "png" else None
            if sized is not None or len(head) >= total:
                return head, read, len(head) >= total
            size *= 4
    fields = reader.read(row)
    name = spec.primary.find(fields)
    if name is None:
        raise SampleError(where, f"no image field among {sorted(fields)}")
    return fields[name], sum(len(value) for value in fields.values()), True


def describe_sample(ds: ShardedDataset, index: int, valid: bool, spec: SampleSpec, transforms: Sequence[Transform],
                    seed: int, epoch: int, cpu_decode: bool = True) -> SampleDescription:
    """Sample ``index``'s key, shard and planned geometry, from its image header (nothing decoded);
    the DCT scale only where libjpeg-turbo decodes it (``cpu_decode``: the CPU backend)."""
    shard, _ = ds.locate(index)
    base = SampleDescription(index, ds.key_of(index), ds.shard_name(shard), valid)
    if spec.primary is None:
        return describe_media(ds, index, spec, transforms, seed, epoch, base)
    read = 0
    try:
        if ds.decoded and DECODED_FIELD in spec.primary.alternatives:
            height, width = ds.index.decoded_shape[:2]  # type: ignore[index]  # decoded: it has a shape
            jpeg = False
        else:
            head, read, _ = _image_head(ds, index, spec)
            width, height = image_size(head, base.where)
            jpeg = sniff_image_format(head) == "jpg"
        planned = plan(transforms, height, width, sample_rng(seed, epoch, index))
    except (SampleError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, SampleError) else str(exc)
        return replace(base, bytes_read=read, problem=reason)
    scale = turbo_scale(planned) if jpeg and cpu_decode and turbo is not None else None
    return replace(base, source_size=(height, width), box=planned.box, size=planned.size, flip=planned.flip,
                   dct_scale=scale, bytes_read=read)


def describe_media(ds: ShardedDataset, index: int, spec: SampleSpec, transforms: Sequence[Transform], seed: int, epoch: int,
                   base: SampleDescription) -> SampleDescription:
    """``base`` with the clips and geometry of the sample's (first requested) video and the crops of
    its (first requested) audio field (each media role of fastload.media in turn, until one has a
    problem), planned from their stream facts in the sample table as a worker plans them (nothing
    of them is read)."""
    for role, media in MEDIA_ROLES.items():
        field = next((f for f in spec.fields if f.role == role), None)
        option = spec.media.get(role)
        if field is None or option is None or base.problem is not None:
            continue
        facts = ds.stream_facts(index)
        name = field.find(facts)
        if name is None:
            base = replace(base, problem=f"no stream facts for {field.name} in its shard's sample table")
            continue
        described = media.describe(facts[name], f"{base.shard}:{base.key}", name, option, transforms, seed, epoch, index, sample_rng)
        own = {key: value for key, value in described.items() if key in SAMPLE_FIELDS}  # its geometry, a problem
        base = replace(base, **own, media={**base.media, role: {key: value for key, value in described.items() if key not in own}})
    return base


def describe_step(ds: ShardedDataset, order_spec: OrderSpec | MixtureOrder, resumed_from: Sequence[ResumedFrom], epoch: int, step: int,
                  spec: SampleSpec, transforms: Sequence[Transform], seed: int, cpu_decode: bool = True,
                  classes: ClassMembers | None = None, skipped: Mapping[str, str] | None = None) -> StepDescription:
    """This rank's batch at ``step`` of ``epoch``, every sample described (see the module docstring);
    ``classes``: the class-balanced order's samples by label (LoaderOrders.classes). ``skipped``
    (``on_error="skip"``: where -> reason of the samples the loader passed over): each sample is
    the one a worker took in its place (:func:`stand_in`)."""
    batch = step_batch(order_spec, resumed_from, epoch, step, classes)
    samples = tuple(stand_in(ds, index, skipped, partial(describe_sample, ds, valid=bool(ok), spec=spec, transforms=transforms, seed=seed,
                                                         epoch=epoch, cpu_decode=cpu_decode))
                    for index, ok in zip(batch.indices.tolist(), batch.valid.tolist()))
    weights = order_spec.weights_at(epoch, batch.position) if isinstance(order_spec, MixtureOrder) else None
    return StepDescription(epoch, step, order_spec.rank, batch.world_size, batch.batch_size, samples, weights)


def stand_in(ds: ShardedDataset, index: int, skipped: Mapping[str, str] | None,
             describe: Callable[[int], SampleDescription]) -> SampleDescription:
    """Sample ``index`` described, or with ``skipped`` (on_error="skip") the sample that took its
    place as a worker picks it (fastload.workers.batch_fill.Substitutes: the next in dataset order,
    passing over those the loader skipped and those that cannot be planned), naming the ones passed."""
    first = describe(index)
    if skipped is None:
        return first
    passed: list[tuple[str, str]] = []
    for offset in range(len(ds)):
        candidate = first if offset == 0 else describe(ds.substitute(index, offset))
        where = candidate.where
        reason = skipped.get(where) or candidate.problem
        if reason is None:
            return replace(candidate, valid=first.valid, stands_in_for=tuple(passed))
        passed.append((where, reason))
    return first  # nothing stands in: the worker raised

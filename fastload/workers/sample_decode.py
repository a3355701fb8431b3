"""One sample's fields read, decoded and transformed, in a worker (or inline).

The geometry (crop, resize, flip) is planned once, from the primary image's header, and applied
to every geometric field: images are decoded only where the crop is (libjpeg-turbo), masks are
cropped by nearest neighbour (class ids stay class ids), boxes are mapped through the same plan.
Fixed-shape fields are written into their rows of the batch slot; the rest are returned as
values. A user ``map`` then sees the decoded sample with a generator seeded from (seed, epoch,
index). What each field's bytes mean is :mod:`fastload.fields`' business; a video's or a recording's
fill is its row of :mod:`fastload.media`'s (handed this worker's random streams and stage clock).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from fastload.decode.cpu import decode_image, turbo
from fastload.decode.header import MAX_PIXELS, image_size
from fastload.decode.mask import mask_dtype, mask_into, read_png_mask
from fastload.errors import SampleError
from fastload.fields import (
    DECODED_FIELD,
    FieldSpec,
    SampleMap,
    SampleSpec,
    decode_field,
    requested_spec,
)
from fastload.media import MEDIA_ROLES, has_frames
from fastload.storage.dataset import ShardedDataset
from fastload.transforms import (
    GEOMETRIC,
    Plan,
    RandomHorizontalFlip,
    Transform,
    dct_min_size,
    map_boxes,
    nearest_into,
    plan,
    resample_into,
)
from fastload.workers.rng import sample_generator, sample_rng
from fastload.workers.stage_clock import DECODE, MAP, READ, READ_BYTES, SAMPLES, TRANSFORM, StageClock, untimed


@dataclass
class PlannedSample:
    """One image read and planned: encoded bytes (or decoded pixels), its Plan, label and key."""

    key: str
    where: str
    label: int
    plan: Plan
    height: int
    width: int
    data: bytes | None = None
    pixels: np.ndarray | None = None


def plan_image(
    key: str, where: str, label: int, image: bytes | np.ndarray, transforms: Sequence[Transform], rng: Any
) -> PlannedSample:
    """Plan the transforms of one image (encoded bytes: from the header; nothing decoded yet)."""
    if isinstance(image, np.ndarray):
        height, width = image.shape[:2]
        return PlannedSample(key, where, label, plan(transforms, height, width, rng), height, width, pixels=image)
    width, height = image_size(image, where)  # a bomb or an empty image is a SampleError here
    return PlannedSample(key, where, label, plan(transforms, height, width, rng), height, width, data=image)


def decode_planned(sample: PlannedSample, out: np.ndarray) -> None:
    """Decode and transform a planned image into ``out`` (C, H, W uint8).

    JPEGs go through the libjpeg-turbo extension when it is built: only the crop's region is
    decoded, at the smallest sufficient DCT scale, and resampled straight into ``out``; other
    RGB pixels (PNG, decoded datasets) are resampled by the same extension, the rest by Pillow.
    """
    check_size(sample.plan.size, out.shape[1:], sample.where)
    if sample.data is None:
        pixels = cast(np.ndarray, sample.pixels)  # a PlannedSample holds either bytes or pixels
    else:
        data = sample.data
        if turbo is not None and data[:3] == b"\xff\xd8\xff" and out.shape[0] == 3:
            try:
                turbo.decode_crop_into(data, sample.plan.box, out, out.shape[1], out.shape[2], sample.plan.flip, MAX_PIXELS)
                return
            except NotImplementedError:
                pass  # CMYK: the generic path below converts it
            except ValueError as exc:
                raise SampleError(sample.where, f"corrupt JPEG: {exc}") from None
            except MemoryError as exc:  # over the pixel limit by libjpeg's own reading of the header
                raise SampleError(sample.where, str(exc)) from None
        min_h, min_w = dct_min_size(sample.plan, sample.height, sample.width)
        pixels = decode_image(data, sample.where, min_h, min_w)
    try:
        resample_into(pixels, sample.plan, sample.height, sample.width, out)
    except ValueError as exc:  # another number of channels than the batch holds
        raise SampleError(sample.where, f"has {exc}") from None


def _geometry(planned: PlannedSample | None, where: str, name: str) -> PlannedSample:
    """The primary image's plan, which masks, boxes and further images follow."""
    if planned is None:
        raise SampleError(where, f"field {name} follows an image's crop, and the sample has no image")
    return planned


def check_size(size: tuple[int, ...], holds: tuple[int, ...], where: str) -> None:
    """A SampleError unless transforms giving ``size`` fit a batch holding ``holds`` (H, W)."""
    if tuple(size) != tuple(holds):
        raise SampleError(where, f"transforms give {size[0]}x{size[1]}, the batch holds {holds[0]}x{holds[1]}")


def fill_sample(
    ds: ShardedDataset, index: int, sample_spec: SampleSpec, transforms: Sequence[Transform], seed: int, epoch: int,
    rows: dict[str, np.ndarray], clock: StageClock,
) -> tuple[str, dict[str, Any]]:
    """Read sample ``index``, write its stacked fields into ``rows`` (field key -> this sample's
    row of the batch slot) and return (sample key, the other fields' values by field key); the
    stages' time goes to ``clock`` (decoding includes the resample libjpeg-turbo fuses with it)."""
    clock.start()
    key, planned, values = fill_beside_primary(ds, index, sample_spec, transforms, seed, epoch, rows, clock)
    if planned is not None and sample_spec.primary is not None:
        decode_planned(planned, rows[sample_spec.primary.key])
        clock.lap(DECODE)
    if sample_spec.map is not None:
        values = _run_map(sample_spec.map, sample_spec, rows, values, _where(ds, index, key), sample_generator(seed, epoch, index))
        clock.lap(MAP)
    clock.count(SAMPLES, 1)
    return key, values


def _where(ds: ShardedDataset, index: int, key: str) -> str:
    """How errors name sample ``index`` whose ``key`` was just read (``ds.where`` would read it again)."""
    return f"{ds.shard_name(ds.locate(index)[0])}:{key}"


def fill_beside_primary(
    ds: ShardedDataset, index: int, sample_spec: SampleSpec, transforms: Sequence[Transform], seed: int, epoch: int,
    rows: dict[str, np.ndarray], clock: StageClock | None = None,
) -> tuple[str, PlannedSample | None, dict[str, Any]]:
    """Read sample ``index``, plan its primary image (not decoded: DALI's feed hands it on as it
    is), write every other stacked field into ``rows`` and return (sample key, the primary's
    plan or None, the other fields' values by field key). No ``map``: it sees the decoded image.
    ``clock`` (from its last mark) gets the read, then the rest as transform."""
    clock = clock or untimed()
    key, stored, pixels = ds.raw(index, sample_spec.stored_names)  # an unrequested field is never read
    clock.lap(READ)
    clock.count(READ_BYTES, sum(map(len, stored.values())) + (pixels.nbytes if pixels is not None else 0))
    where = _where(ds, index, key)
    present: dict[str, Any] = stored if pixels is None else {**stored, DECODED_FIELD: pixels}
    names = {field.name: _stored_name(field, present, where) for field in sample_spec.fields}
    values: dict[str, Any] = {}
    planned = None
    primary = sample_spec.primary
    if primary is not None:
        image = present[cast(str, names[primary.name])]  # the primary image is never optional: found or raised
        planned = plan_image(key, where, -1, image, transforms, sample_rng(seed, epoch, index))
    for field in sample_spec.fields:
        name = names[field.name]
        if name is None:  # an optional label the sample lacks
            rows[field.key][...] = -1
            continue
        data = present[name]
        if field is primary:
            continue
        if field.role == "image":  # a second image: the primary's plan, so it must be of the same size
            geometry = _geometry(planned, where, name)
            _check_same_size(image_size(data, where)[::-1], geometry, where, field.name)
            decode_planned(PlannedSample(key, where, -1, geometry.plan, geometry.height, geometry.width, data=data), rows[field.key])
        elif field.role == "mask":
            _fill_mask(data, _geometry(planned, where, name), rows[field.key], where, name)
        elif field.role == "boxes":
            values[field.key] = map_boxes(decode_field("boxes", data, where, name), _geometry(planned, where, name).plan)
        elif field.role == "array" and field.key in rows:
            _copy_array(decode_field("array", data, where, name), rows[field.key], where, name)
        elif field.role == "label":
            rows[field.key][...] = decode_field("label", data, where, name)
        elif field.role in MEDIA_ROLES:  # its sampling: a spec with such a field has one (SampleSpec checks)
            media = MEDIA_ROLES[field.role]
            media.fill(data, where, name, ds.stream_facts(index).get(name), sample_spec.media[field.role], transforms, seed, epoch,
                       index, [rows[field.key]] + [rows[column] for column in media.beside(field.key)], sample_rng, clock)
        else:
            values[field.key] = decode_field(field.role, data, where, name)
    clock.lap(TRANSFORM)
    return key, planned, values


def _fill_mask(data: bytes, geometry: PlannedSample, row: np.ndarray, where: str, name: str) -> None:
    """The mask's class ids under the primary image's plan, into its batch row: decoded at the
    crop (PNG, by the C extension) where it can be, else whole by Pillow and then cropped."""
    check_size(geometry.plan.size, row.shape, where)
    png = read_png_mask(data, where, name)
    if png is not None:
        _check_same_size((png.height, png.width), geometry, where, name)
        _check_mask_fits(png.bit_depth == 16, row, where, name)
        mask_into(png, geometry.plan.box, geometry.plan.flip, row, where, name)
        return
    mask = decode_field("mask", data, where, name)
    _check_same_size(mask.shape, geometry, where, name)
    _check_mask_fits(mask.dtype.itemsize > 1, row, where, name)
    nearest_into(mask, geometry.plan, row)


def _check_mask_fits(wide: bool, row: np.ndarray, where: str, name: str) -> None:
    """A SampleError for a 16-bit mask (``wide``) in a batch of 8-bit masks."""
    if wide and row.dtype.itemsize == 1:
        raise SampleError(where, f"field {name}: a 16-bit mask; the batch stacks {row.dtype} masks (the dataset's first samples)")


def _stored_name(field: FieldSpec, present: dict[str, Any], where: str) -> str | None:
    name = field.find(present)
    if name is None and not field.optional:
        if field.role == "image":
            raise SampleError(where, f"no image field among {sorted(present)}")
        if field.role in MEDIA_ROLES:
            raise SampleError(where, f"no field {field.name} among {sorted(present)} (the field '{field.role}' {MEDIA_ROLES[field.role].takes})")
        raise SampleError(where, f"no field {field.name} among {sorted(present)}")
    return name


def _check_same_size(shape: tuple[int, ...], planned: PlannedSample, where: str, name: str) -> None:
    if tuple(shape[:2]) != (planned.height, planned.width):
        raise SampleError(
            where, f"field {name}: {shape[0]}x{shape[1]}, its image is {planned.height}x{planned.width} (it must be the image's size)"
        )


def _copy_array(array: np.ndarray, row: np.ndarray, where: str, name: str) -> None:
    if array.shape != row.shape or array.dtype != row.dtype:
        raise SampleError(
            where, f"field {name}: array {array.dtype}{list(array.shape)}, the batch stacks {row.dtype}{list(row.shape)} "
            "(the shape of the dataset's first samples)"
        )
    np.copyto(row, array)


def _run_map(sample_map: SampleMap, sample_spec: SampleSpec, rows: dict[str, np.ndarray], values: dict[str, Any], where: str, rng: np.random.Generator) -> dict[str, Any]:
    """Apply the user's map to the decoded sample (stacked fields as their writable batch rows);
    what it returns for a stacked field is copied into the row. Any exception is a SampleError
    naming the sample, its traceback text carried in the chained cause."""
    sample = {field.key: rows[field.key] if field.key in rows else values[field.key] for field in sample_spec.fields}
    try:
        result = sample_map(sample, rng)
    except Exception as exc:  # the user's traceback travels as the cause (a worker sends its text along)
        raise SampleError(where, f"map= raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, dict) or set(result) != set(sample):
        got = sorted(result) if isinstance(result, dict) else type(result).__name__
        raise SampleError(where, f"map= must return the sample's dict with the keys {sorted(sample)}, got {got}")
    out: dict[str, Any] = {}
    for field in sample_spec.fields:
        value = result[field.key]
        if field.key not in rows:
            out[field.key] = value
        elif value is not rows[field.key]:
            row = rows[field.key]
            value = np.asarray(value)
            if value.shape != row.shape or not np.can_cast(value.dtype, row.dtype, "same_kind"):
                raise SampleError(
                    where, f"map= returned {field.key} as {value.dtype}{list(value.shape)}, the batch holds {row.dtype}{list(row.shape)}"
                )
            np.copyto(row, value, casting="same_kind")
    return out


PROBED_SAMPLES = 8  # samples of the first shard that decide how array and mask fields are stacked


def probe_array_shapes(ds: ShardedDataset, sample_spec: SampleSpec) -> SampleSpec:
    """``sample_spec`` with what the batch slots need to know of its arrays and masks, from up to
    PROBED_SAMPLES samples spread over the first shard (only that shard: a remote dataset fetches
    nothing more): each array field whose arrays share one shape and dtype is stacked (others are
    ragged, batched as lists); a mask field holding 16-bit masks is stacked as uint16."""
    arrays = [f for f in sample_spec.fields if f.role == "array"]
    masks = [f for f in sample_spec.fields if f.role == "mask"]
    if not (arrays or masks) or not len(ds):
        return sample_spec
    first = ds.index.shards[0].samples
    positions = sorted({int(p) for p in np.linspace(0, max(first, 1) - 1, min(first, PROBED_SAMPLES) or 1)})
    seen: dict[str, set[tuple[tuple[int, ...], str]]] = {f.name: set() for f in arrays}
    wide: set[str] = set()
    for position in positions:
        _, stored, _ = ds.raw(position, frozenset(name for f in (*arrays, *masks) for name in f.alternatives))
        for f in arrays:
            name = f.find(stored)
            try:
                array = decode_field("array", stored[name], ds.where(position), name) if name is not None else None
            except SampleError:
                continue  # a bad sample says nothing about the others
            if array is not None:
                seen[f.name].add((tuple(array.shape), array.dtype.str))
        for f in masks:
            name = f.find(stored)
            if name is not None and mask_dtype(stored[name]) == "uint16":
                wide.add(f.name)
    shapes = tuple((name, *next(iter(found))) for name, found in seen.items() if len(found) == 1)
    return replace(sample_spec, array_shapes=shapes, wide_masks=tuple(f.name for f in masks if f.name in wide))


def resolve_spec(
    ds: ShardedDataset, fields: Sequence[str] | Mapping[str, str] | None, map: SampleMap | None, transform: Sequence[Transform],
    media: Mapping[str, Any] | None = None,
) -> SampleSpec:
    """What a loader's workers make of each sample of ``ds``, from its ``fields=``, ``map=`` and
    ``media`` (each media role's sampling, decided: ``clip=``, ``audio=``):
    :func:`fastload.fields.requested_spec`, with stacked arrays' shapes probed."""
    geometric = any(isinstance(t, (*GEOMETRIC, RandomHorizontalFlip)) for t in transform)
    images = bool(ds.index.image_fields) or geometric  # a transform: images are expected, whatever the index lists
    sample_spec = probe_array_shapes(ds, requested_spec(fields, ds.index.fields, ds.decoded, map, images, media, ds.index.columns,
                                                        ds.classic_names))
    if sample_spec.primary is None and geometric and not has_frames(sample_spec.media):
        raise ValueError(f"transform= crops and flips images; the fields asked for ({', '.join(f.name for f in sample_spec.fields)}) hold none")
    return sample_spec

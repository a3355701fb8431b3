"""One shard's work, run by an engine in a worker: load its items, clean them, write the shard."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fastload._util.files import naming
from fastload.converters.clean import check_image, encode_png, reencode_jpeg
from fastload.converters.convert_options import ConvertOptions
from fastload.converters.plan import ShardPlan
from fastload.converters.sample import Sample, SourceItem
from fastload.converters.sources import Source
from fastload.decode.header import image_size
from fastload.errors import SampleError
from fastload.fields import JPEG_FIELD, LABEL_FIELD, default_role, stream_fields
from fastload.formats.shard_info import ShardInfo
from fastload.formats.table import TABLE_SUFFIX
from fastload.formats.writing import PreparedSample, open_writer

if TYPE_CHECKING:
    import numpy as np

    from fastload.av.facts import MediaFacts


@dataclass(frozen=True)
class ShardTask:
    """Everything a worker needs to write one shard, picklable."""

    source: Source
    plan: ShardPlan
    out_dir: str
    options: ConvertOptions
    decoded_shape: tuple[int, ...] | None = None
    upload_to: str | None = None  # a dataset URL: upload the finished shard there, then drop the local copy


@dataclass
class ShardResult:
    """What a finished shard contributes to the index (``info`` is None when every sample was skipped)."""

    number: int
    info: ShardInfo | None
    skipped: list[dict[str, str]] = field(default_factory=list)
    class_counts: dict[int, int] = field(default_factory=dict)
    fields: list[str] = field(default_factory=list)
    image_fields: list[str] = field(default_factory=list)
    sources: str = ""  # sources_digest of its items when it was written: resume redoes it if they changed
    pixel_shape: list[int] | None = None  # of the decoded pixels it holds (HDF5 --hdf5-decoded), if any
    filtered: int = 0  # token shards: documents left out for having fewer than --min-tokens tokens
    video: bool = False  # whether it holds videos (their stream facts in its sample table)


@dataclass
class WrittenShards:
    """The shards of a conversion: each one's result, in plan order, and how many were written
    now, kept from a previous run, or written again because their sources changed since."""

    results: list[ShardResult] = field(default_factory=list)
    written: int = 0
    reused: int = 0
    changed: int = 0


def prepare_sample(sample: Sample, options: ConvertOptions, decoded_shape: tuple[int, ...] | None) -> PreparedSample:
    """Validate and convert one loaded sample to what the writer stores; raises SampleError."""
    image = sample.image
    decoded = options.writer_options.hdf5_decoded
    extra, facts = prepare_streams(sample, options)
    if image is None:  # arrays, text, ...: nothing to clean
        if decoded:
            raise SampleError(sample.where, "has no image to store as decoded pixels (--hdf5-decoded)")
        return PreparedSample(key=sample.key, image_field=None, image=None, label=sample.label, extra=extra, facts=facts)
    if not isinstance(image, bytes):  # pixels from an array source
        field_name = "pixels" if decoded else "png"
        stored: bytes | np.ndarray = image if decoded else encode_png(image)
    else:
        field_name = check_image(image, sample.where, options.max_pixels)
        if options.max_size is not None and max(image_size(image, sample.where, options.max_pixels)) > options.max_size:
            check_nothing_in_pixels(sample, options.max_size)
        if options.reencode_quality is not None or options.max_size is not None:
            image = reencode_jpeg(image, sample.where, options.reencode_quality or 95, options.max_size, options.max_pixels)
            field_name = JPEG_FIELD
        if decoded:
            from fastload.decode.cpu import decode_image  # numpy, simplejpeg: only when decoding

            field_name, stored = "pixels", decode_image(image, sample.where, max_pixels=options.max_pixels)
        else:
            stored = image
    check_decoded_shape(stored, sample.where, decoded_shape)
    return PreparedSample(key=sample.key, image_field=field_name, image=stored, label=sample.label, extra=extra, facts=facts)


def prepare_streams(sample: Sample, options: ConvertOptions) -> tuple[dict[str, bytes], dict[str, MediaFacts]]:
    """The sample's fields with each of a media role (fastload.media) prepared by its role: a video
    re-encoded where asked (``--reencode``, ``--max-size``), a recording (``--audio-codec``,
    ``--audio-rate``); and their stream facts; a SampleError for one that does not probe
    (corrupt, truncated, empty, a codec FFmpeg lacks, over the pixel or the audio limits)."""
    streams = stream_fields(sample.extra)
    if not streams:
        return sample.extra, {}
    if options.layout != "wds":
        raise SampleError(sample.where, f"videos and recordings are stored in tar shards (--to wds), not {options.layout}: "
                                        "their stream facts live in the sample tables")
    from fastload.media import MEDIA_ROLES

    extra, facts = dict(sample.extra), {}  # type: dict[str, bytes], dict[str, MediaFacts]
    for name in streams:
        where = f"{sample.where} ({name})" if len(streams) > 1 else sample.where
        data = extra[name]
        stored_name, stored, facts_of = MEDIA_ROLES[default_role(name)].prepare(data, where, name, options)
        if stored is not data:  # re-encoded: stored under its new name, after the others
            del extra[name]
            extra[stored_name] = stored
        facts[stored_name] = facts_of
    return extra, facts


_GEOMETRY_WORDS = ("box", "mask", "seg", "keypoint", "polygon", "point", "landmark")  # in a field's name: pixel coordinates, likely


def check_nothing_in_pixels(sample: Sample, max_size: int) -> None:
    """A SampleError when ``--max-size`` would shrink the image of a sample whose other fields are
    drawn in its pixels: another image (a mask, a depth map) or a field named for boxes, masks,
    keypoints. They would stay in the original frame, silently misplaced after the resize."""
    drawn = sorted(name for name in sample.extra if default_role(name) == "image" or any(w in name.lower() for w in _GEOMETRY_WORDS))
    if drawn:
        raise SampleError(
            sample.where, f"--max-size {max_size} would shrink the image but not its fields {', '.join(drawn)} (in its pixel frame); "
            "convert without --max-size, or resize them first"
        )


def check_decoded_shape(stored: bytes | np.ndarray | None, where: str, decoded_shape: tuple[int, ...] | None) -> None:
    """SampleError naming ``where`` when decoded pixels differ from the dataset's fixed shape."""
    if decoded_shape is not None and stored is not None and not isinstance(stored, bytes) and stored.shape != decoded_shape:
        raise SampleError(where, f"image shape {stored.shape} differs from the dataset's fixed shape {decoded_shape}")


def sources_digest(items: tuple[SourceItem, ...]) -> str:
    """What a shard is made from: its items' keys and file stamps (size, mtime_ns), hashed."""
    return hashlib.sha256("\n".join(f"{item.key} {item.stamp}" for item in items).encode()).hexdigest()


def write_shard(task: ShardTask) -> ShardResult:
    """Write one shard; bad samples raise or, with on_error='skip', are left out and reported."""
    with naming(Path(task.out_dir) / task.plan.name):
        return _write_shard(task)


def _write_shard(task: ShardTask) -> ShardResult:
    builder = ShardBuilder(task.plan.number, Path(task.out_dir), task.plan.name, task.options)
    try:
        for item in task.plan.items:
            try:
                prepared: PreparedSample | SampleError = prepare_sample(task.source.load(item), task.options, task.decoded_shape)
            except SampleError as exc:
                prepared = exc
            builder.add(item, prepared)
        return builder.finish(task.upload_to)
    except BaseException:
        builder.abort()
        raise


class ShardBuilder:
    """One shard written sample by sample, in plan order: each item with its prepared sample or
    the SampleError preparing it raised (raised here, or skipped and reported, as on_error says)."""

    def __init__(self, number: int, out_dir: Path, name: str, options: ConvertOptions) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)  # a Ray worker on another node writes to its own staging
        self.out_dir, self.path, self.options = out_dir, out_dir / name, options
        self.items: list[SourceItem] = []
        self.result = ShardResult(number=number, info=None)
        self._writer = open_writer(options.layout, self.path, options.writer_options)
        self._labels: Counter[int] = Counter()
        self._fields: set[str] = set()
        self._image_fields: set[str] = set()

    def add(self, item: SourceItem, prepared: PreparedSample | SampleError) -> None:
        """Append ``item``'s sample, or record (or raise) why it could not be prepared."""
        self.items.append(item)
        if isinstance(prepared, SampleError):
            if self.options.on_error == "raise":
                raise prepared
            self.result.skipped.append({"key": item.key, "where": prepared.where, "reason": prepared.reason})
            return
        with naming(self.path):
            self._writer.add(prepared)
        if prepared.label is not None:
            self._labels[prepared.label] += 1
            self._fields.add(LABEL_FIELD)
        self._fields.update(prepared.extra)
        if prepared.image_field is not None:
            self._fields.add(prepared.image_field)
            self._image_fields.add(prepared.image_field)
        self.result.video = self.result.video or bool(prepared.facts)
        if self.result.pixel_shape is None and prepared.image is not None and not isinstance(prepared.image, bytes):
            self.result.pixel_shape = list(prepared.image.shape)

    def finish(self, upload_to: str | None = None) -> ShardResult:
        """Publish the shard (none when every sample was skipped), upload it to ``upload_to`` if
        given, and return its result."""
        result = self.result
        with naming(self.path):
            if len(self.items) == len(result.skipped):
                self._writer.abort()
                for stale in (self.path, self.path.with_suffix(".idx"), self.path.with_suffix(TABLE_SUFFIX)):
                    stale.unlink(missing_ok=True)  # a previous run's copy, when its samples were readable then
            else:
                result.info = self._writer.finish()
        result.sources = sources_digest(tuple(self.items))
        result.class_counts = dict(sorted(self._labels.items()))
        result.fields = sorted(self._fields)
        result.image_fields = sorted(self._image_fields)
        if upload_to is not None and result.info is not None:
            upload_shard(self.out_dir, result.info, upload_to)
        return result

    def abort(self) -> None:
        """Remove the shard's temporary files (after a failure, or when a finished copy is kept)."""
        self._writer.abort()


def upload_shard(local_root: Path, info: ShardInfo, url: str) -> None:
    """Upload a finished shard (its offset index and sample table, then its data) to the dataset
    at ``url``, then delete the local copies: staging holds only shards in flight."""
    from fastload.storage import remote

    names = [name for name in (info.offsets, info.table, info.path) if name]
    for name in names:
        remote.upload(local_root / name, remote.join(url, name))
    for name in names:
        (local_root / name).unlink()

"""The conversion's settings, validated once, in one frozen dataclass."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from fastload.converters.sources import SOURCE_MODULES, SourceOptions
from fastload.converters.writers import WRITER_MODULES, WriterOptions
from fastload.decode.header import MAX_PIXELS
from fastload.errors import check_on_error
from fastload.sizes import parse_size

__all__ = ["ConvertOptions", "parse_size"]


@dataclass(frozen=True)
class ConvertOptions:
    """Everything ``fastload convert`` takes; equal options and input give byte-identical output."""

    source: str
    layout: str = "wds"
    shard_bytes: int | None = 256 * 10**6
    samples_per_shard: int | None = None
    shuffle: bool = False
    seed: int = 0
    workers: int = 1
    limit: int | None = None
    dedupe: bool = False  # drop exact duplicates (content hash)
    near_threshold: int | None = None  # drop near duplicates: perceptual signatures this many bits apart or closer
    on_error: str = "raise"
    reencode_quality: int | None = None
    max_size: int | None = None
    max_pixels: int = MAX_PIXELS  # the one limit every decode path applies (fastload.decode.header)
    reencode_video: bool = False  # videos re-encoded to H.264 (also when max_size shrinks them)
    keyframe_interval: int = 32  # frames between keyframes of a re-encoded video
    source_options: SourceOptions = field(default_factory=SourceOptions)
    writer_options: WriterOptions = field(default_factory=WriterOptions)

    def __post_init__(self) -> None:
        if self.source not in SOURCE_MODULES:
            raise ValueError(f"unknown source {self.source!r}; expected one of {sorted(SOURCE_MODULES)}")
        if self.layout not in WRITER_MODULES:
            raise ValueError(f"unknown output layout {self.layout!r}; expected one of {sorted(WRITER_MODULES)}")
        check_on_error(self.on_error)
        if self.samples_per_shard is not None:
            if self.samples_per_shard < 1:
                raise ValueError("samples_per_shard must be >= 1")
            object.__setattr__(self, "shard_bytes", None)
        elif self.shard_bytes is None or self.shard_bytes < 1:
            raise ValueError("give a positive shard size in bytes or samples_per_shard")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.limit is not None and self.limit < 0:
            raise ValueError("limit must be >= 0")
        if self.reencode_quality is not None and not 1 <= self.reencode_quality <= 100:
            raise ValueError("reencode_quality must be in 1..100")
        if self.max_pixels < 1:
            raise ValueError("max_pixels must be >= 1")
        if self.max_size is not None and self.max_size < 1:
            raise ValueError("max_size must be >= 1")
        if self.keyframe_interval < 1:
            raise ValueError("keyframe_interval must be >= 1")
        if self.near_threshold is not None:
            from fastload.near.search import check_threshold

            check_threshold(self.near_threshold)
            if self.dedupe:
                raise ValueError("choose exact (dedupe) or near (near_threshold) deduplication, not both")
        if self.writer_options.hdf5_decoded and self.layout != "hdf5":
            raise ValueError("decoded pixel storage is an HDF5 option (--to hdf5)")

    def fingerprint(self) -> dict:
        """The settings that determine the output bytes (not ``workers``), for resume checks."""
        data = asdict(self)
        data.pop("workers")
        if self.near_threshold is None:
            data.pop("near_threshold")  # absent when off: indexes written before it existed still match
        if not self.reencode_video:
            data.pop("reencode_video")  # likewise
            data.pop("keyframe_interval")
        return data

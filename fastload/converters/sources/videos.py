"""Video files: class folders (ROOT/CLASS/clip.mp4, as ``imagefolder``) or a manifest (CSV, TSV or
JSON lines) of video paths with labels and, optionally, captions. Each sample holds the video
under its container's extension (``mp4``, ``webm``, ...; an ``.ogg`` file as ``ogv``), its label and its caption (``txt``); the
video's stream facts are read when the sample is prepared (fastload.converters.shard)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fastload.converters.sample import Sample, SourceItem, make_key, unique_keys
from fastload.converters.sources import SourceOptions
from fastload.converters.sources.imagefolder import ImageFolderSource
from fastload.converters.sources.imagefolder import open_source as open_folder
from fastload.converters.sources.manifest import ManifestSource, read_rows
from fastload.converters.sources.manifest import open_source as open_manifest
from fastload.errors import SampleError
from fastload.fields import VIDEO_FIELDS

FIELD_OF_EXTENSION = {**{f".{ext}": ext for ext in VIDEO_FIELDS}, ".ogg": "ogv"}  # a file's extension: the field it is stored under
VIDEO_EXTENSIONS = frozenset(FIELD_OF_EXTENSION)


@dataclass(frozen=True)
class VideoSource:
    """The videos a class folder or a manifest lists, with their captions by key (a manifest's)."""

    files: ImageFolderSource | ManifestSource
    captions: dict[str, str]
    field_of_extension: dict[str, str] = field(default_factory=lambda: FIELD_OF_EXTENSION)  # a file's extension: its field
    kind: str = "video"  # what its files are, in errors

    @property
    def classes(self) -> tuple[str, ...] | None:
        """Class names by label, where the labels were names."""
        return self.files.classes

    def items(self) -> list[SourceItem]:
        """One item per video file, in the folder's or the manifest's order."""
        return self.files.items()

    def load(self, item: SourceItem) -> Sample:
        """The video's bytes under its extension, its label and caption."""
        name = self.field_of_extension.get(Path(item.ref[0]).suffix.lower())  # a folder's and a manifest's ref: (relative path, label, ...)
        if name is None:
            raise SampleError(item.where, f"not a {self.kind} file name (expected one of {', '.join(sorted(self.field_of_extension))})")
        read = self.files.load(item)
        assert isinstance(read.image, bytes)  # a folder's and a manifest's samples are the file's bytes
        extra = {name: read.image}
        if item.key in self.captions:
            extra["txt"] = self.captions[item.key].encode()
        return Sample(key=item.key, where=item.where, image=None, label=read.label, extra=extra)


def open_source(path: str, options: SourceOptions) -> VideoSource:
    """A folder of class folders of videos, or a manifest file listing videos."""
    return open_media(path, options, FIELD_OF_EXTENSION, "video")


def open_media(path: str, options: SourceOptions, field_of_extension: dict[str, str], kind: str) -> VideoSource:
    """A folder of class folders of media files, or a manifest listing them (with captions or
    transcripts in its caption column), each stored under ``field_of_extension[its extension]``."""
    if Path(path).is_dir():
        return VideoSource(open_folder(path, options, frozenset(field_of_extension)), {}, field_of_extension, kind)
    manifest = open_manifest(path, options)
    rows = read_rows(Path(path))
    keys = unique_keys([make_key(str(row[options.path_column])) for row in rows])
    captions = {key: str(row[options.caption_column]) for key, row in zip(keys, rows) if row.get(options.caption_column) not in (None, "")}
    return VideoSource(manifest, captions, field_of_extension, kind)

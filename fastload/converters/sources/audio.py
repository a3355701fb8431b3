"""Recordings: class folders (ROOT/CLASS/clip.flac, as ``imagefolder``) or a manifest (CSV, TSV or
JSON lines) of paths with labels and, optionally, transcripts (the ``--caption-column``, stored as
each sample's ``txt``). Each sample holds the recording under its extension (``flac``, ``wav``,
``mp3``, ``ogg``, ``opus``, ``m4a``, ...); its stream facts are read when the sample is prepared
(fastload.converters.shard), as a video's are."""

from __future__ import annotations

from fastload.converters.sources import SourceOptions
from fastload.converters.sources.videos import VideoSource, open_media
from fastload.fields import AUDIO_FIELDS

FIELD_OF_EXTENSION = {f".{ext}": ext for ext in AUDIO_FIELDS}


def open_source(path: str, options: SourceOptions) -> VideoSource:
    """A folder of class folders of recordings, or a manifest file listing them."""
    return open_media(path, options, FIELD_OF_EXTENSION, "recording")

"""Recordings of every codec fastload reads, made in the fixture (tests/audio/media.py), as class
folders and converted into shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastload.converters import ConvertOptions, convert
from tests.audio.media import CODECS, recording

# (extension, seconds, rate, channels) of each recording: every codec, several rates and channel counts
PLAN: tuple[tuple[str, float, int, int], ...] = (
    ("flac", 2.0, 16000, 1), ("wav", 1.5, 22050, 2), ("mp3", 2.5, 44100, 2), ("ogg", 1.75, 16000, 2), ("opus", 2.25, 48000, 1),
    ("m4a", 2.0, 16000, 1), ("flac", 3.0, 44100, 2), ("wav", 2.0, 16000, 1),
)


@pytest.fixture(scope="session")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """ROOT/c0, ROOT/c1: the recordings of PLAN; and the samples encoded in each, by key (c0/r0, ...)."""
    assert set(CODECS) == {ext for ext, *_ in PLAN}
    root = tmp_path_factory.mktemp("recordings")
    truth = {}
    for i, (ext, seconds, rate, channels) in enumerate(PLAN):
        folder = root / f"c{i % 2}"
        folder.mkdir(exist_ok=True)
        data, samples = recording(ext, seconds, rate, channels, seed=i)
        (folder / f"r{i}.{ext}").write_bytes(data)
        truth[f"c{i % 2}/r{i}"] = samples
    return root, truth


@pytest.fixture(scope="session")
def audio_dataset(recordings: tuple[Path, dict[str, np.ndarray]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recordings converted into shards of 4 samples."""
    out = tmp_path_factory.mktemp("audio-wds")
    convert(str(recordings[0]), str(out), ConvertOptions(source="audio", samples_per_shard=4), quiet=True)
    return out

"""Video fixtures: small folders of videos (tests/video/media.py) and their conversions."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastload.converters import ConvertOptions, convert
from tests.video.media import video_folder


@pytest.fixture(scope="session")
def videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT/c0, ROOT/c1: six H.264 videos of 24, 30 and 40 frames (96x64, a keyframe every 8)."""
    return video_folder(tmp_path_factory.mktemp("videos"))


@pytest.fixture(scope="session")
def video_dataset(videos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The video folder converted into shards of 4 samples."""
    out = tmp_path_factory.mktemp("video-wds")
    convert(str(videos), str(out), ConvertOptions(source="videos", samples_per_shard=4), quiet=True)
    return out

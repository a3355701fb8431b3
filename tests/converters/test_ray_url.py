"""Conversion on Ray straight to an fsspec URL (moto's S3 server on loopback): each Ray task
writes its shard to local staging, uploads it and drops the local copy; the driver publishes the
index last. A module of its own: Ray starts here after the S3 settings are in the environment,
which its workers inherit (as they would take them from a cluster node's own configuration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastload.cli.demo import make_demo_images
from fastload.converters import ConvertOptions, convert
from tests.conftest import tree_bytes

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_ray_tasks_write_to_an_s3_url(s3_endpoint, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    photos = make_demo_images(tmp_path / "raw", 60)
    options = ConvertOptions(source="imagefolder", samples_per_shard=6, shuffle=True, seed=3, workers=2)
    convert(str(photos), str(tmp_path / "local"), options)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        url = "s3://fastload-test/ray-out"
        report = convert(str(photos), url, options, engine="ray", quiet=True, staging=str(tmp_path / "staging"))
    finally:
        ray.shutdown()
    assert report.shards_written == 10
    s3_endpoint.get("fastload-test/ray-out/", str(tmp_path / "down") + "/", recursive=True)
    assert tree_bytes(tmp_path / "down") == tree_bytes(tmp_path / "local")
    assert not (tmp_path / "staging").exists()

"""Bad video input: a truncated file, a container lying about its frame count, a zero-length
stream, a 16k x 16k frame size, a codec FFmpeg lacks, a table promising frames the video lacks,
a decode past its time limit. Each is a one-line error naming the file or a counted skip; memory
stays bounded (RLIMIT_AS) and nothing hangs (pytest-timeout, the decode's own deadline)."""

from __future__ import annotations

import io
import json
import re
import shutil
import zlib
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import Clip
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.formats.index import read_index
from tests.hostile_data import run_limited, with_frame_size
from tests.video.media import camera_frames, encode, every_frame, video


def avi_lying_about_its_length(frames: int, claimed: int) -> bytes:
    """An MJPEG AVI of ``frames`` frames whose headers (avih, strh) claim ``claimed``."""
    data = bytearray(encode(camera_frames(5, frames, 64, 48), codec="mjpeg", container="avi", gop=1))
    avih, strh = data.find(b"avih") + 8, data.find(b"strh") + 8
    data[avih + 16 : avih + 20] = claimed.to_bytes(4, "little")  # dwTotalFrames
    data[strh + 32 : strh + 36] = claimed.to_bytes(4, "little")  # dwLength
    return bytes(data)


def huge_frames() -> bytes:
    """A Matroska MJPEG video whose track and JPEG headers say 16000 x 16000 (its data is tiny)."""
    jpeg = io.BytesIO()
    Image.fromarray(camera_frames(6, 1, 64, 48)[0]).save(jpeg, format="JPEG")
    bomb = with_frame_size(jpeg.getvalue(), 16000, 16000)
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:
        stream = out.add_stream("mjpeg", rate=24)
        stream.width = stream.height = 16000
        stream.pix_fmt = "yuvj420p"
        for k in range(3):
            packet = av.Packet(bomb)
            packet.stream, packet.pts, packet.dts, packet.is_keyframe = stream, k, k, True
            out.mux(packet)
    return buf.getvalue()


def no_frames(container: str) -> bytes:
    """A file of ``container`` with a video track and not one frame."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        out.start_encoding()
    return buf.getvalue()


@pytest.fixture(scope="module")
def hostile_videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-videos")
    (root / "c").mkdir()
    good = video(7, 16)
    files = {
        "good.mp4": good,
        "truncated.mp4": good[: len(good) // 2],  # its moov (at the end) cut off
        "empty.mp4": b"",
        "no_frames.mkv": no_frames("matroska"),  # a zero-length stream: Matroska ends before its first cluster
        "no_frames.mp4": no_frames("mp4"),  # MP4's demuxer drops a track without samples
        "unknown_codec.avi": encode(camera_frames(8, 4, 64, 48), codec="mjpeg", container="avi", gop=1).replace(b"MJPG", b"ZZZZ"),
        "huge.mkv": huge_frames(),
        "lying.avi": avi_lying_about_its_length(6, 1000),
    }
    for name, data in files.items():
        (root / "c" / name).write_bytes(data)
    return root


@pytest.mark.timeout(120)
def test_bad_videos_are_skipped_at_conversion_one_line_each_in_bounded_memory(hostile_videos: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_limited(f"""
        import json
        from fastload.converters import ConvertOptions, convert
        report = convert({str(hostile_videos)!r}, {str(out)!r}, ConvertOptions(source="videos", on_error="skip"), quiet=True)
        print(json.dumps({{"samples": report.index.num_samples}}))
    """, memory_bytes=1 << 30)
    assert result["samples"] == 2  # good.mp4 and lying.avi
    reasons = {Path(entry["where"]).name: entry["reason"] for entry in map(json.loads, (out / "skipped.jsonl").read_text().splitlines())}
    assert reasons == {
        "truncated.mp4": "not a readable video (InvalidDataError)",
        "empty.mp4": "empty video: zero bytes",
        "no_frames.mkv": "not a readable video (EOFError)",
        "no_frames.mp4": "holds no video stream",
        "unknown_codec.avi": "no decoder for its video codec ('unknown') in this FFmpeg",
        "huge.mkv": "decompression bomb or damaged header: no frame size within the pixel limit 89478485",
    }
    assert all("\n" not in reason for reason in reasons.values())


def test_a_container_lying_about_its_frame_count_is_read_for_the_frames_it_holds(hostile_videos: Path, tmp_path: Path) -> None:
    convert(str(hostile_videos), str(tmp_path / "out"), ConvertOptions(source="videos", on_error="skip"), quiet=True)
    ds = fastload.open(tmp_path / "out")
    lying = next(i for i in range(len(ds)) if ds.key_of(i).endswith("lying"))
    with av.open(io.BytesIO(ds.raw(lying)[1]["avi"])) as container:
        assert container.streams.video[0].frames == 1000  # what its header claims
    assert ds.stream_facts(lying)["avi"].frames == 6  # what it holds, counted at conversion
    loader = fastload.DataLoader(torch.utils.data.Subset(ds, [lying]), fields=["avi"], batch_size=1, clip=Clip(frames=6, sampling="uniform"),
                                 transform=[T.Resize((48, 64))])
    (clip,) = next(iter(loader))
    truth = every_frame(ds.raw(lying)[1]["avi"])
    assert len(truth) == 6 and all(np.array_equal(clip[0, t].permute(1, 2, 0).numpy(), truth[t]) for t in range(6))


def test_a_table_promising_frames_the_video_lacks_is_a_bad_sample_by_name(video_dataset: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(video_dataset, copy)
    table = copy / read_index(copy).shards[0].table
    data = bytearray(table.read_bytes())
    at = data.rindex((24).to_bytes(8, "little") + (96).to_bytes(8, "little"))  # sample c0/v00's (frames, width)
    data[at : at + 8] = (60).to_bytes(8, "little")
    table.write_bytes(bytes(data))
    options = dict(batch_size=1, clip=Clip(frames=4, stride=10, sampling="uniform"), transform=T.train(16))
    with pytest.raises(fastload.SampleError, match=r"shard-00000.tar:c0/v00: the video ends before frame 24 \(its sample table says 60 frames\)"):
        list(fastload.DataLoader(copy, **options))
    loader = fastload.DataLoader(copy, on_error="skip", **options)
    assert sum(len(labels) for _, labels in loader) == 6 and len(loader.stats.skipped) == 1


def test_a_decode_past_its_time_limit_is_a_bad_sample(video_dataset: Path) -> None:
    loader = fastload.DataLoader(video_dataset, batch_size=2, clip=Clip(frames=4, timeout_s=1e-9), transform=T.train(16))
    with pytest.raises(fastload.SampleError, match=r"shard-0000\d.tar:c\d/v\d\d: decoding took longer than its time limit \(at frame \d+\)"):
        next(iter(loader))


def test_clips_of_tars_indexed_in_place_are_refused_naming_the_missing_facts(tmp_path: Path) -> None:
    import tarfile

    from fastload.cli import main

    with tarfile.open(tmp_path / "part-0.tar", "w") as tar:
        for name, data in (("a.mp4", video(9, 12)), ("a.cls", b"0")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert main(["index", str(tmp_path)]) == 0
    loader = fastload.DataLoader(tmp_path, batch_size=1, clip=Clip(frames=2), transform=T.train(16))
    with pytest.raises(fastload.SampleError, match="part-0.tar:a: field mp4: no stream facts in its shard's sample table"):
        next(iter(loader))


def skipped_reasons(out: Path) -> dict[str, str]:
    """The file name and reason of each entry of a conversion's skipped.jsonl."""
    return {Path(entry["where"]).name: entry["reason"] for entry in map(json.loads, (out / "skipped.jsonl").read_text().splitlines())}


def concat_script(listed: str, size: int = 0) -> bytes:
    """An FFmpeg concat script naming the file ``listed``, padded by a comment to ``size`` bytes."""
    script = f"ffconcat version 1.0\nfile {listed}\n".encode()
    return script + (b"#" + b"x" * (size - len(script) - 2) + b"\n" if size else b"")


def test_a_concat_script_named_mp4_opens_no_file_it_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FFmpeg's concat demuxer resolves the paths a script lists against the working directory:
    a script in the dataset would bring in a video from outside it. Refused by name when probed,
    re-encoded and loaded, before any file it lists is opened."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outside.mp4").write_bytes(video(3, 12))
    raw = tmp_path / "raw" / "c"
    raw.mkdir(parents=True)
    (raw / "good.mp4").write_bytes(video(4, 12))
    (raw / "script.mp4").write_bytes(concat_script("outside.mp4"))
    refused = "its format (concat) is not a video container fastload reads"
    for reencode in (False, True):
        out = tmp_path / f"out-{reencode}"
        report = convert(str(tmp_path / "raw"), str(out), ConvertOptions(source="videos", on_error="skip", reencode_video=reencode), quiet=True)
        assert report.index.num_samples == 1 and skipped_reasons(out)["script.mp4"].startswith(refused)
    ds = fastload.open(tmp_path / "out-False")
    offset, size = ds.reader(0).spans(0)["mp4"]
    ds.close()
    with open(tmp_path / "out-False" / read_index(tmp_path / "out-False").shards[0].path, "r+b") as f:  # the video swapped for a script
        f.seek(offset)
        f.write(concat_script("outside.mp4", size))
    loader = fastload.DataLoader(tmp_path / "out-False", batch_size=1, clip=Clip(frames=2), transform=T.train(16))
    with pytest.raises(fastload.SampleError, match=rf"shard-00000.tar:c/good: {re.escape(refused)}"):
        next(iter(loader))


def png_of_zeros(width: int, height: int) -> bytes:
    """A black RGB PNG of ``width`` x ``height``: tiny on disk, width * height * 3 bytes decoded."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    packer = zlib.compressobj(9)
    rows = b"".join(packer.compress(b"\0" * (1 + 3 * width)) for _ in range(height)) + packer.flush()
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def avi_declaring(width: int, height: int, *frames: bytes) -> bytes:
    """An AVI whose PNG video track declares ``width`` x ``height`` and holds ``frames``."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="avi") as out:
        stream = out.add_stream("png", rate=24)
        stream.width, stream.height, stream.pix_fmt = width, height, "rgb24"
        for number, frame in enumerate(frames):
            packet = av.Packet(frame)
            packet.stream, packet.pts, packet.dts, packet.is_keyframe = stream, number, number, True
            out.mux(packet)
    return buf.getvalue()


@pytest.mark.timeout(120)
def test_a_frame_over_the_pixel_limit_is_never_decoded_whatever_its_container_declares(tmp_path: Path) -> None:
    """A 12000 x 12000 PNG (432 MB decoded) named .mp4, the same PNG as the one frame of an AVI
    declaring 64 x 48, and as the second frame after a small one: refused without the frame ever
    being decoded, when probed and when re-encoded (FFmpeg's probing decoded it before the limit
    was checked, re-encoding decoded the second frame before checking it)."""
    big = png_of_zeros(12000, 12000)
    (tmp_path / "raw" / "c").mkdir(parents=True)
    (tmp_path / "raw" / "c" / "image.mp4").write_bytes(big)
    (tmp_path / "raw" / "c" / "small_header.avi").write_bytes(avi_declaring(64, 48, big))
    (tmp_path / "raw" / "c" / "big_second.avi").write_bytes(avi_declaring(64, 48, png_of_zeros(64, 48), big))
    (tmp_path / "raw" / "c" / "good.mp4").write_bytes(video(2, 8))
    result = run_limited(f"""
        import json, re
        from pathlib import Path
        from fastload.converters import ConvertOptions, convert
        for reencode in (False, True):
            options = ConvertOptions(source="videos", on_error="skip", reencode_video=reencode)
            report = convert({str(tmp_path / "raw")!r}, {str(tmp_path)!r} + f"/out-{{reencode}}", options, quiet=True)
            assert report.index.num_samples == (1 if reencode else 2)  # probing decodes the first frame only
        peak = re.search(r"VmHWM:\\s*(\\d+) kB", Path("/proc/self/status").read_text())  # this process's peak resident memory
        print(json.dumps({{"peak_mb": int(peak.group(1)) // 1024}}))
    """, memory_bytes=2 << 30)
    assert result["peak_mb"] < 300  # the frame alone would be 432 MB
    for reencode in (False, True):
        reasons = skipped_reasons(tmp_path / f"out-{reencode}")
        assert reasons["image.mp4"].startswith("its format (png_pipe) is not a video container fastload reads")
        assert reasons["small_header.avi"] == "decompression bomb or damaged header: no frame size within the pixel limit 89478485"
    assert skipped_reasons(tmp_path / "out-True")["big_second.avi"] == "does not decode for re-encoding (ArgumentError)"

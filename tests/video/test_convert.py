"""Converting videos: stream facts in the sample table, the index's version, re-encoding,
captions, --from wds, inspect and verify."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

import fastload
from fastload.cli import main
from fastload.converters import ConvertOptions, convert
from fastload.formats.index import FORMAT_VERSION, VIDEO_FORMAT_VERSION, read_index, write_index
from fastload.formats.table import TABLE_MAGIC, VIDEO_TABLE_MAGIC
from fastload.storage.verify import verify_dataset
from tests.video.media import video


def test_videos_convert_with_their_stream_facts_in_the_sample_table(video_dataset: Path) -> None:
    index = read_index(video_dataset)
    assert index.version == VIDEO_FORMAT_VERSION and index.fields == ("cls", "mp4") and index.classes == ("c0", "c1")
    assert (video_dataset / index.shards[0].table).read_bytes()[:8] == VIDEO_TABLE_MAGIC
    ds = fastload.open(video_dataset)
    found = {ds.key_of(i): ds.stream_facts(i)["mp4"] for i in range(len(ds))}
    assert {key: facts.frames for key, facts in found.items()} == {
        "c0/v00": 24, "c0/v02": 40, "c0/v04": 30, "c1/v01": 30, "c1/v03": 24, "c1/v05": 40}
    facts = found["c0/v02"]
    assert (facts.codec, facts.width, facts.height, facts.rate) == ("h264", 96, 64, (24, 1))
    assert facts.keyframes == (0, 8, 16, 24, 32) and facts.keyframe_pts == tuple(k * 512 for k in facts.keyframes)


def test_an_image_dataset_keeps_version_1_tables_and_index_version_3(clean: Path) -> None:
    index = read_index(clean)
    assert index.version == FORMAT_VERSION == 3
    assert (clean / index.shards[0].table).read_bytes()[:8] == TABLE_MAGIC


def test_reencode_gives_h264_with_the_keyframe_interval_asked_for(tmp_path: Path) -> None:
    (tmp_path / "raw" / "a").mkdir(parents=True)
    (tmp_path / "raw" / "a" / "clip.mkv").write_bytes(video(1, 20, codec="mpeg4", container="matroska", gop=20))
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos", reencode_video=True, keyframe_interval=5, max_size=48), quiet=True)
    ds = fastload.open(tmp_path / "out")
    assert ds.index.fields == ("cls", "mp4")
    facts = ds.stream_facts(0)["mp4"]
    assert (facts.codec, facts.width, facts.height, facts.frames, facts.keyframes) == ("h264", 48, 32, 20, (0, 5, 10, 15))


def test_reencode_keeps_the_interval_over_a_source_of_all_keyframes_and_max_size_is_never_passed(tmp_path: Path) -> None:
    """An MJPEG source (every frame a keyframe) re-encoded with a keyframe every 8 frames gets
    exactly those; --max-size 51 of 96 x 64 rounds the sides down to even (50 x 34), never up."""
    (tmp_path / "raw" / "a").mkdir(parents=True)
    (tmp_path / "raw" / "a" / "clip.avi").write_bytes(video(2, 24, codec="mjpeg", container="avi", gop=1))
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos", reencode_video=True, keyframe_interval=8, max_size=51), quiet=True)
    facts = fastload.open(tmp_path / "out").stream_facts(0)["mp4"]
    assert (facts.width, facts.height, facts.frames, facts.keyframes) == (50, 34, 24, (0, 8, 16))


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg cuts the video (-ss with -c copy writes an edit list)")
def test_a_video_cut_by_an_edit_list_is_refused_and_reencoding_takes_what_a_player_shows(tmp_path: Path) -> None:
    """``ffmpeg -ss T -c copy`` keeps the frames before T, flagged for the decoder to drop: frame
    numbers would then depend on the keyframe a seek lands on. Refused by name; --reencode keeps
    the frames a player shows."""
    import subprocess

    from tests.video.media import every_frame

    (tmp_path / "raw" / "a").mkdir(parents=True)
    (tmp_path / "whole.mp4").write_bytes(video(9, 48, gop=24))
    cut = tmp_path / "raw" / "a" / "cut.mp4"
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-ss", "0.25", "-i", str(tmp_path / "whole.mp4"), "-c", "copy", str(cut)], check=True, timeout=60)
    shown = len(every_frame(cut.read_bytes()))
    assert shown < 48
    with pytest.raises(fastload.errors.SampleError, match=r"cut.mp4: an edit list hides some of its frames .*convert with --reencode"):
        convert(str(tmp_path / "raw"), str(tmp_path / "refused"), ConvertOptions(source="videos"), quiet=True)
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos", reencode_video=True), quiet=True)
    assert fastload.open(tmp_path / "out").stream_facts(0)["mp4"].frames == shown


def test_a_manifest_gives_labels_and_captions(tmp_path: Path) -> None:
    for name in ("one.mp4", "two.webm"):
        (tmp_path / name).write_bytes(video(2, 12, codec="libvpx-vp9" if name.endswith("webm") else "libx264",
                                            container="webm" if name.endswith("webm") else "mp4"))
    (tmp_path / "list.jsonl").write_text(json.dumps({"path": "one.mp4", "label": "run", "caption": "a pan to the right"}) + "\n"
                                         + json.dumps({"path": "two.webm", "label": "jump"}) + "\n")
    convert(str(tmp_path / "list.jsonl"), str(tmp_path / "out"), ConvertOptions(source="videos"), quiet=True)
    ds = fastload.open(tmp_path / "out")
    assert ds.classes == ["jump", "run"]
    assert ds[0]["txt"] == b"a pan to the right" and ds[0]["label"] == 1 and "txt" not in ds[1]
    assert ds.stream_facts(1)["webm"].codec == "vp9"


def test_from_wds_keeps_mp4_members_and_records_their_facts(tmp_path: Path) -> None:
    tar_path = tmp_path / "in" / "part-0.tar"
    tar_path.parent.mkdir()
    with tarfile.open(tar_path, "w") as tar:
        for i, (name, data) in enumerate([("a.mp4", video(3, 16)), ("a.cls", b"1"), ("b.mp4", video(4, 18)), ("b.cls", b"0")]):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), i
            tar.addfile(info, io.BytesIO(data))
    convert(str(tmp_path / "in"), str(tmp_path / "out"), ConvertOptions(source="wds"), quiet=True)
    ds = fastload.open(tmp_path / "out")
    assert [ds.stream_facts(i)["mp4"].frames for i in range(2)] == [16, 18]
    assert read_index(tmp_path / "out").version == VIDEO_FORMAT_VERSION


def test_videos_refuse_hdf5_shards_by_name(tmp_path: Path, videos: Path) -> None:
    with pytest.raises(fastload.SampleError, match="c0/v00.mp4: videos and recordings are stored in tar shards"):
        convert(str(videos), str(tmp_path / "out"), ConvertOptions(source="videos", layout="hdf5"), quiet=True)


def test_inspect_summarises_the_videos_and_verify_decode_checks_their_facts(video_dataset: Path, tmp_path: Path, capsys) -> None:
    assert main(["inspect", str(video_dataset)]) == 0
    assert "videos    6, h264 6; 7.8 s, 24-40 frames, a keyframe every 7.8 frames; 96x64 to 96x64; 0 with audio" in capsys.readouterr().out
    assert verify_dataset(video_dataset, decode=True).ok
    copy = tmp_path / "copy"
    shutil.copytree(video_dataset, copy)
    index = read_index(copy)
    table = copy / index.shards[0].table
    data = bytearray(table.read_bytes())
    at = data.rindex((24).to_bytes(8, "little") + (96).to_bytes(8, "little"))  # a sample's (frames, width)
    data[at : at + 8] = (23).to_bytes(8, "little")
    table.write_bytes(bytes(data))
    assert verify_dataset(copy).problems == [f"{index.shards[0].table}: missing or sha256 mismatch (the shard's sample table is corrupted)"]
    shards = (replace(index.shards[0], table_sha256=hashlib.sha256(bytes(data)).hexdigest()), *index.shards[1:])
    write_index(copy, replace(index, shards=shards))  # a table tampered with consistently: only decoding tells
    assert verify_dataset(copy).ok
    problems = verify_dataset(copy, decode=True).problems
    assert len(problems) == 1 and problems[0].endswith("field mp4: its stream facts in the sample table disagree with the video (tampered table?)")


def mean_frames_decoded(keyframes: list[int], frames: int, span: int) -> float:
    """Every start of a clip covering ``span`` frames, each decoding from the keyframe at or before it to its last frame."""
    starts = range(max(frames - span, 0) + 1)
    return sum(min(s + span, frames) - max(k for k in keyframes if k <= s) for s in starts) / len(starts)


def test_inspect_says_when_reencoding_with_short_keyframe_intervals_pays_off(tmp_path: Path, capsys) -> None:
    """A keyframe every 250 frames (x264's default) makes a random clip decode about a hundred
    frames; inspect said nothing of it. It gives the frames a clip decodes on average, as stored
    and with --reencode's keyframe every 32, and advises --reencode where that saves 1.5x or more."""
    for gop in (250, 8):
        raw = tmp_path / f"raw{gop}"
        for i, frames in enumerate((300, 130)):
            (raw / "a").mkdir(parents=True, exist_ok=True)
            (raw / "a" / f"v{i}.mp4").write_bytes(video(i, frames, 48, 32, gop=gop))
        convert(str(raw), str(tmp_path / f"out{gop}"), ConvertOptions(source="videos"), quiet=True)
        for clip, span in (("16:2", 31), ("8", 8)):
            expected = [mean_frames_decoded(list(range(0, n, gop)), n, span) for n in (300, 130)]
            again = [mean_frames_decoded(list(range(0, n, 32)), n, span) for n in (300, 130)]
            assert main(["inspect", str(tmp_path / f"out{gop}"), "--json", "--clip", clip]) == 0
            videos = json.loads(capsys.readouterr().out)["videos"]
            assert videos["clip_frames_decoded"] == round(sum(expected) / 2, 1) and videos["clip_frames_decoded_reencoded"] == round(sum(again) / 2, 1)
            assert videos["reencode_factor"] == round(sum(expected) / sum(again), 2)
            assert main(["inspect", str(tmp_path / f"out{gop}"), "--clip", clip]) == 0
            line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("clips "))
            factor = sum(expected) / sum(again)
            assert f"decodes {sum(expected) / 2:.1f} frames on average" in line and f"{factor:.2f}x fewer" in line
            assert line.endswith("worth it for training on clips") == (gop == 250), line


def test_a_damaged_video_table_is_a_shard_error_never_a_crash(video_dataset: Path, tmp_path: Path) -> None:
    import numpy as np

    from fastload.errors import ShardError
    from fastload.formats.table import SampleTable
    from tests.hostile_data import mutate

    index = read_index(video_dataset)
    data = (video_dataset / index.shards[0].table).read_bytes()
    rng = np.random.default_rng(0)
    outcomes = {"read": 0, "refused": 0}
    for _ in range(300):
        damaged = mutate(data, rng, keep=8)
        try:
            table = SampleTable(tmp_path / "t.table", index.shards[0].samples, damaged)
            for i in range(len(table)):
                table.key(i), table.spans(i), table.stream_facts(i)
            outcomes["read"] += 1
        except ShardError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 100 and sum(outcomes.values()) == 300


def test_reencoding_gives_the_same_bytes_whatever_the_workers_and_what_the_process_encoded_before(tmp_path: Path) -> None:
    """x264's macroblock tree read memory an earlier encoder in the process had left: --workers 1
    and 2 (and a rerun in a process that had encoded other videos) gave different shards."""
    from tests.video.media import video_folder

    raw = video_folder(tmp_path / "raw", count=6, frames=(20, 26, 33))
    shards = {}
    for workers in (1, 2, 1):
        out = tmp_path / f"out-{len(shards)}"
        convert(str(raw), str(out), ConvertOptions(source="videos", reencode_video=True, workers=workers), quiet=True)
        shards[len(shards)] = {path.name: path.read_bytes() for path in out.iterdir() if path.name.startswith("shard-")}
    assert shards[0] == shards[1] == shards[2]


def test_mpeg_program_and_elementary_streams_and_ogg_files_convert_or_are_reported_by_name(tmp_path: Path) -> None:
    """.mpg, .mpeg, .mpv and .ogg files were left out of a folder in silence; now each converts
    (an .ogg stored as ogv), or, in a container fastload does not open, is reported by name."""
    from tests.video.media import camera_frames, encode, ffmpeg_encode

    frames = camera_frames(3, 20, 96, 64)
    files = {
        "ps2.mpg": encode(frames, codec="mpeg2video", container="vob", bframes=2),
        "ps1.mpeg": encode(frames, codec="mpeg1video", container="mpeg", bframes=2),
        "es.mpv": encode(frames, codec="mpeg2video", container="mpeg2video", bframes=2),
        "theora.ogg": ffmpeg_encode(frames, ".ogg", "-c:v", "libtheora", "-q:v", "7"),
        "transport.mpg": encode(frames, codec="mpeg2video", container="mpegts"),
    }
    (tmp_path / "raw" / "c").mkdir(parents=True)
    for name, data in files.items():
        (tmp_path / "raw" / "c" / name).write_bytes(data)
    report = convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos", on_error="skip"), quiet=True)
    ds = fastload.open(tmp_path / "out")
    assert report.index.num_samples == 4 and ds.index.fields == ("cls", "mpeg", "mpg", "mpv", "ogv")
    assert sorted(facts.codec for i in range(4) for facts in ds.stream_facts(i).values()) == ["mpeg1video", "mpeg2video", "mpeg2video", "theora"]
    assert all(facts.frames == 20 for i in range(4) for facts in ds.stream_facts(i).values())
    (skipped,) = map(json.loads, (tmp_path / "out" / "skipped.jsonl").read_text().splitlines())
    assert skipped["where"].endswith("transport.mpg") and skipped["reason"].startswith("its format (mpegts) is not a video container")


def test_verify_decode_fails_a_video_where_a_loader_would(tmp_path: Path) -> None:
    """An MJPEG AVI whose sixth frame is damaged probes fine (a probe decodes the first frame);
    verify --decode said OK while every clip over that frame failed. It decodes every frame as a
    loader does now, and reports the same problem."""
    import re

    from fastload import Clip
    from fastload import transforms as T
    from tests.video.media import camera_frames, encode

    data = bytearray(encode(camera_frames(2, 8, 96, 64), codec="mjpeg", container="avi", gop=1))
    sixth = [m.start() for m in re.finditer(b"\xff\xd8\xff", data)][5]  # its JPEG's start
    data[sixth + 200 : sixth + 1500] = bytes(1300)
    (tmp_path / "raw" / "c").mkdir(parents=True)
    (tmp_path / "raw" / "c" / "damaged.avi").write_bytes(bytes(data))
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos"), quiet=True)
    problem = "shard-00000.tar:c/damaged: frame 5 does not decode (InvalidDataError)"
    assert verify_dataset(tmp_path / "out", decode=True).problems == [problem]
    loader = fastload.DataLoader(tmp_path / "out", batch_size=1, clip=Clip(frames=8, sampling="uniform"), transform=[T.Resize((64, 96))])
    with pytest.raises(fastload.SampleError, match=re.escape(problem)):
        next(iter(loader))

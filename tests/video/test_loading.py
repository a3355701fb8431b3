"""Loading clips through fastload.DataLoader: the frames the plan names, decoded from the keyframe
before them, equal to decoding every frame from the start; the same crop and flip for every frame;
a pure function of (seed, epoch, index): worker counts, exact and elastic resume, equal batches
across ranks; describe, stats, Normalize on whole clips, on_error="skip"."""

from __future__ import annotations

import io
import shutil
from collections import Counter
from pathlib import Path

import av
import numpy as np
import pytest
import torch

import fastload
from fastload import Clip
from fastload import transforms as T
from fastload.cli import main
from fastload.formats.index import read_index
from fastload.transforms import apply_plan
from fastload.workers.stage_clock import READ_BYTES
from tests.test_resume_contract import run_resume_contract
from tests.video.media import every_frame

SIZE = (64, 96)  # the fixture's frames: Resize to it keeps every pixel


def frames_of(dataset: Path) -> dict[str, list[np.ndarray]]:
    """Every frame of each video of a converted dataset, decoded from the start, by key."""
    ds = fastload.open(dataset)
    return {ds.key_of(i): every_frame(ds.raw(i)[1]["mp4"]) for i in range(len(ds))}


def test_clips_hold_the_planned_frames_as_decoding_from_the_start_gives_them(video_dataset: Path) -> None:
    truth = frames_of(video_dataset)
    loader = fastload.DataLoader(video_dataset, batch_size=2, shuffle=True, seed=3, num_workers=2, return_keys=True,
                                 clip=Clip(frames=5, stride=3), transform=[T.Resize(SIZE)])
    seen = 0
    for step, (clips, labels, keys) in enumerate(loader):
        assert clips.shape == (2, 5, 3, *SIZE) and clips.dtype == torch.uint8 and labels.dtype == torch.int64
        for row, sample in enumerate(loader.describe(step, 0).samples):
            assert sample.key == keys[row] and sample.video == "mp4" and len(sample.clips) == 1
            first, last, _, _ = sample.clips[0]
            frames = [min(first + 3 * k, len(truth[sample.key]) - 1) for k in range(5)]
            assert frames[-1] == last
            for t, frame in enumerate(frames):  # a seek to the keyframe before, then decoding: the very frames
                assert torch.equal(clips[row, t], torch.from_numpy(truth[sample.key][frame]).permute(2, 0, 1))
            seen += 1
    assert seen == 6


def test_long_clips_far_from_a_keyframe_decode_as_from_the_start(tmp_path: Path) -> None:
    """x264's default: a keyframe every 250 frames. Clips spanning more than 64 frames, and a
    second clip reached by decoding on from the first, hold the very frames (the decoder's budget
    is each target's own)."""
    from fastload.converters import ConvertOptions, convert
    from tests.video.media import video

    (tmp_path / "raw" / "a").mkdir(parents=True)
    data = video(4, 300, gop=250)
    (tmp_path / "raw" / "a" / "long.mp4").write_bytes(data)
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos"), quiet=True)
    truth = every_frame(data)
    for clip in (Clip(frames=16, stride=8, sampling="uniform"), Clip(frames=8, stride=2, clips=3, sampling="uniform")):
        loader = fastload.DataLoader(tmp_path / "out", batch_size=1, clip=clip, transform=[T.Resize(SIZE)])
        clips, _ = next(iter(loader))
        for c, (first, _, _, _) in enumerate(loader.describe(0, 0).samples[0].clips):
            for t in range(clip.frames):
                frame = truth[min(first + clip.stride * t, len(truth) - 1)]
                assert torch.equal(clips[0, c, t] if clip.clips > 1 else clips[0, t], torch.from_numpy(frame).permute(2, 0, 1)), (clip, c, t)


@pytest.mark.parametrize("codec, bframes", [("libx264", 3), ("libx265", 4)])
def test_frames_before_a_clip_that_none_refers_to_are_skipped_and_clips_stay_the_same(tmp_path: Path, codec: str, bframes: int) -> None:
    """Frames a clip does not keep that no other frame refers to are not decoded (FFmpeg's skip_frame
    NONREF, numbered by their timestamps), before a clip, between its kept frames (a stride) and
    after its last: with B-frames that other B-frames refer to (x264's and x265's pyramids) and
    x265's open groups of frames, every clip, one crossing a keyframe, one decoding on from another,
    far into a group or at its start, holds the frames decoding from the start gives."""
    from tests.video.media import camera_frames, encode

    data = encode(camera_frames(8, 90, 96, 64), codec=codec, gop=40, bframes=bframes)
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.codec_context.skip_frame = "NONREF"
        assert len(list(container.decode(stream))) < 0.7 * 90  # frames the skip passes over
    assert_clips_decode_as_from_the_start(tmp_path, "pyramid.mp4", data)
    truth = every_frame(data)
    for clip in (Clip(frames=4, stride=1, clips=9, sampling="uniform"), Clip(frames=2, stride=37, clips=3, sampling="uniform"),
                 Clip(frames=5, stride=2, clips=7, sampling="uniform"), Clip(frames=3, stride=3, clips=5, sampling="uniform")):
        loader = fastload.DataLoader(tmp_path / "out", batch_size=1, clip=clip, transform=[T.Resize(SIZE)])
        (clips,) = next(iter(fastload.DataLoader(tmp_path / "out", batch_size=1, clip=clip, transform=[T.Resize(SIZE)], fields=["mp4"])))
        for c, (first, _, _, _) in enumerate(loader.describe(0, 0).samples[0].clips):
            for t in range(clip.frames):
                assert torch.equal(clips[0, c, t], torch.from_numpy(truth[min(first + clip.stride * t, 89)]).permute(2, 0, 1)), (clip, c, t)


def test_every_frame_of_a_clip_gets_the_same_crop_and_flip(video_dataset: Path) -> None:
    truth = frames_of(video_dataset)
    loader = fastload.DataLoader(video_dataset, batch_size=3, shuffle=True, seed=8, clip=Clip(frames=4, stride=2),
                                 transform=T.train(32), return_keys=True)
    clips, _, keys = next(iter(loader))
    for row, sample in enumerate(loader.describe(0, 0).samples):
        first = sample.clips[0][0]
        plan = fastload.transforms.Plan(sample.box, sample.size, sample.flip)
        for t in range(4):
            expected = apply_plan(truth[keys[row]][first + 2 * t], plan, *SIZE)  # Pillow's resample of the same crop
            assert np.abs(clips[row, t].permute(1, 2, 0).numpy().astype(int) - expected).max() <= 2


def batches(loader: fastload.DataLoader) -> list[tuple[torch.Tensor, list[str]]]:
    return [(clips.clone(), list(keys)) for clips, _, keys in loader]


def test_clips_are_a_pure_function_of_seed_epoch_and_index(video_dataset: Path) -> None:
    def loader(workers: int, seed: int = 1) -> fastload.DataLoader:
        return fastload.DataLoader(video_dataset, batch_size=2, shuffle=True, seed=seed, num_workers=workers, return_keys=True,
                                   clip=Clip(frames=4, stride=2), transform=T.train(24))

    inline, workers = loader(0), loader(2)
    first = batches(inline)
    again = batches(workers)
    assert [k for _, k in first] == [k for _, k in again] and all(torch.equal(a, b) for (a, _), (b, _) in zip(first, again))
    second_epoch = batches(inline)
    assert [k for _, k in second_epoch] != [k for _, k in first]
    inline.close(), workers.close()


def test_random_clips_stay_inside_the_video_for_every_stride(video_dataset: Path) -> None:
    """Every stride whose clip fits the shortest video (24 frames): each clip spans its whole
    ``(frames - 1) * stride + 1`` frames inside the video, none cut at its end, over 8 epochs."""
    truth = frames_of(video_dataset)
    lengths = {key: len(frames) for key, frames in truth.items()}
    for stride in range(1, 6):
        clip = Clip(frames=5, stride=stride, sampling="random")
        loader = fastload.DataLoader(video_dataset, batch_size=3, shuffle=True, seed=stride, clip=clip, transform=[T.Resize(SIZE)])
        for epoch in range(8):
            for step in range(len(loader)):
                for sample in loader.describe(step, epoch).samples:
                    first, last, _, _ = sample.clips[0]
                    assert first >= 0 and last == first + clip.span - 1 < lengths[sample.key], (stride, epoch, sample.key, first, last)
        clips, _ = next(iter(loader))  # and the batch holds those frames, unrepeated
        for row, sample in enumerate(loader.describe(0, 0).samples):
            first = sample.clips[0][0]
            for t in range(5):
                assert torch.equal(clips[row, t], torch.from_numpy(truth[sample.key][first + stride * t]).permute(2, 0, 1))


def test_a_videos_random_clip_changes_from_epoch_to_epoch_and_describe_names_it(video_dataset: Path) -> None:
    """Epochs 0 to 3 draw other clips of each video; an epoch's batches hold the clips
    ``describe(step, epoch)`` names, for epochs other than 0 too."""
    truth = frames_of(video_dataset)
    loader = fastload.DataLoader(video_dataset, batch_size=2, shuffle=True, seed=4, return_keys=True, clip=Clip(frames=3, stride=2),
                                 transform=[T.Resize(SIZE)])
    starts: dict[str, list[int]] = {}
    for epoch in range(4):
        loader.set_epoch(epoch)
        for step, (clips, _, keys) in enumerate(loader):
            described = loader.describe(step, epoch).samples
            assert [sample.key for sample in described] == list(keys)
            for row, sample in enumerate(described):
                first = sample.clips[0][0]
                starts.setdefault(sample.key, []).append(first)
                for t in range(3):
                    assert torch.equal(clips[row, t], torch.from_numpy(truth[sample.key][first + 2 * t]).permute(2, 0, 1)), (epoch, step, row)
    assert len(starts) == 6 and all(len(set(firsts)) > 1 for firsts in starts.values()), starts


@pytest.mark.parametrize("taken", [0, 1])
def test_resume_mid_epoch_equals_an_uninterrupted_run(video_dataset: Path, taken: int) -> None:
    run_resume_contract(lambda: fastload.DataLoader(video_dataset, batch_size=4, shuffle=True, seed=5, num_workers=1, return_keys=True,
                                                    clip=Clip(frames=3, stride=4), transform=T.train(16)), taken)


def test_elastic_resume_delivers_every_remaining_clip_once_with_equal_batches_per_rank(video_dataset: Path) -> None:
    options = dict(batch_size=1, shuffle=True, seed=2, return_keys=True, clip=Clip(frames=2), transform=T.train(16))
    whole = [k for _, _, keys in fastload.DataLoader(video_dataset, **options) for k in keys]
    first = [fastload.DataLoader(video_dataset, rank=r, world_size=2, **options) for r in range(2)]
    assert len(first[0]) == len(first[1]) == 3  # equal batches on every rank
    before = [k for loader in first for k in next(iter(loader))[2]]  # one batch on each rank
    state = first[0].state_dict()
    assert state["samples_consumed"] == 2
    resumed = fastload.DataLoader(video_dataset, **options)
    resumed.load_state_dict(state)
    after = [k for _, _, keys in resumed for k in keys]
    assert Counter(before) + Counter(after) == Counter(whole) and len(after) == 4


def test_several_uniform_clips_a_video_for_evaluation(video_dataset: Path) -> None:
    loader = fastload.DataLoader(video_dataset, batch_size=6, clip=Clip(frames=4, stride=2, clips=3), transform=T.val(32, normalize=True))
    clips, _ = next(iter(loader))
    assert clips.shape == (6, 3, 4, 3, 32, 32) and clips.dtype == torch.float32
    assert loader.options.clip.sampling == "uniform"
    for sample in loader.describe(0, 0).samples:
        last = fastload.open(video_dataset).stream_facts(sample.index)["mp4"].frames - 7  # a clip covers 7 frames
        assert [c[0] for c in sample.clips] == [0, round(last / 2), last]  # evenly spaced over the video
    raw = fastload.DataLoader(video_dataset, batch_size=6, clip=Clip(frames=4, stride=2, clips=3), transform=T.val(32))
    pixels, _ = next(iter(raw))
    mean = torch.tensor(T.IMAGENET_MEAN).view(3, 1, 1) * 255
    std = torch.tensor(T.IMAGENET_STD).view(3, 1, 1) * 255
    assert torch.allclose(clips, (pixels.float() - mean) / std, atol=1e-4)  # Normalize on whole clips, per channel


def test_a_video_shorter_than_its_clip_repeats_its_last_frame(video_dataset: Path) -> None:
    loader = fastload.DataLoader(video_dataset, batch_size=1, clip=Clip(frames=20, stride=2), transform=[T.Resize(SIZE)], return_keys=True)
    clips, _, _ = next(iter(loader))
    facts = fastload.open(video_dataset).stream_facts(0)["mp4"]
    assert facts.frames == 24 and loader.describe(0, 0).samples[0].clips == ((0, 23, 0.0, round(23 / 24, 6)),)
    assert all(torch.equal(clips[0, t], clips[0, 12]) for t in range(12, 20))  # frames 24.. do not exist: frame 23 again


def test_stats_time_reading_decoding_and_transforming_clips(video_dataset: Path) -> None:
    loader = fastload.DataLoader(video_dataset, batch_size=3, num_workers=2, clip=Clip(frames=4), transform=T.train(16))
    for _ in loader:
        pass
    epoch = loader.stats.epochs[-1]
    stages = epoch.stage_s()
    ds = fastload.open(video_dataset)
    stored = sum(len(value) for i in range(len(ds)) for value in ds.raw(i)[1].values())
    assert epoch.samples == 6 and epoch.workers is not None and epoch.workers[:, READ_BYTES].sum() == stored
    assert stages["decode"] > stages["transform"] > 0 and stages["decode"] > stages["read"] > 0
    loader.close()


def with_a_broken_video(video_dataset: Path, tmp_path: Path, index: int) -> tuple[Path, str, str]:
    """A copy of the dataset in which sample ``index``'s video has its header and first frames
    overwritten: (the copy, the sample's key, where it is)."""
    copy = tmp_path / "copy"
    shutil.copytree(video_dataset, copy)
    ds = fastload.open(copy)
    shard, row = ds.locate(index)
    offset, size = ds.reader(shard).spans(row)["mp4"]
    key, where = ds.key_of(index), ds.where(index)
    ds.close()
    with open(copy / read_index(copy).shards[shard].path, "r+b") as f:
        f.seek(offset)
        f.write(b"\0" * (size // 2))
    return copy, key, where


def test_a_video_that_fails_to_decode_is_skipped_by_name(video_dataset: Path, tmp_path: Path) -> None:
    copy, key, _ = with_a_broken_video(video_dataset, tmp_path, 1)
    options = dict(batch_size=2, clip=Clip(frames=3), transform=T.train(16), return_keys=True)
    with pytest.raises(fastload.SampleError, match=f"shard-00000.tar:{key}: (not a readable video|its format .* is not a video container)"):
        list(fastload.DataLoader(copy, **options))
    loader = fastload.DataLoader(copy, on_error="skip", num_workers=1, **options)
    keys = [k for _, _, keys in loader for k in keys]
    assert len(keys) == 6 and key not in keys  # the batch kept its size: the next sample stood in
    assert [entry["where"] for entry in loader.stats.skipped.entries] == [f"shard-00000.tar:{key}"]
    loader.close()


def test_clip_and_video_fields_are_asked_for_together(video_dataset: Path, clean: Path) -> None:
    with pytest.raises(ValueError, match="field mp4 is a video: give clip=fastload.Clip"):
        fastload.DataLoader(video_dataset, batch_size=2, transform=T.train(16))
    with pytest.raises(ValueError, match="clip= takes frames of videos; the fields asked for hold none"):
        fastload.DataLoader(clean, batch_size=2, clip=Clip(frames=2), transform=T.train(16))
    with pytest.raises(ValueError, match="videos of this dataset vary in size: give a transform"):
        fastload.DataLoader(video_dataset, batch_size=2, clip=Clip(frames=2))
    with pytest.raises(ValueError, match="Clip stride must be a whole number >= 1, got 0"):
        Clip(frames=4, stride=0)
    fields = fastload.DataLoader(video_dataset, batch_size=2, fields=["mp4", "cls"], clip=Clip(frames=2), transform=T.train(16))
    clips, labels = next(iter(fields))
    assert clips.shape == (2, 2, 3, 16, 16) and labels.shape == (2,)


def test_a_videos_sound_needs_audio_and_its_bytes_stay_available(video_dataset: Path) -> None:
    """A video's sound track loads as audio (tests/audio/test_loading.py) when audio= says which crops."""
    with pytest.raises(ValueError, match="field mp4 is audio: give audio=fastload.Audio"):
        fastload.DataLoader(video_dataset, batch_size=2, fields={"mp4": "audio"})
    raw = fastload.DataLoader(video_dataset, batch_size=2, fields={"mp4": "bytes"})
    (videos,) = next(iter(raw))
    assert isinstance(videos[0], bytes) and videos[0][4:8] == b"ftyp"  # the file, for audio decoded elsewhere


def assert_clips_decode_as_from_the_start(root: Path, name: str, data: bytes) -> None:
    """The video ``data`` converted as ``root``/raw/a/``name``, then loaded in uniform and random
    clips over several epochs: each clip frame equals decoding every frame from the start."""
    from fastload.converters import ConvertOptions, convert

    (root / "raw" / "a").mkdir(parents=True)
    (root / "raw" / "a" / name).write_bytes(data)
    convert(str(root / "raw"), str(root / "out"), ConvertOptions(source="videos"), quiet=True)
    truth = every_frame(data)
    (field,) = (f for f in fastload.open(root / "out").index.fields if f != "cls")
    assert fastload.open(root / "out").stream_facts(0)[field].frames == len(truth)
    for clip in (Clip(frames=3, stride=5, clips=4, sampling="uniform"), Clip(frames=4, stride=3, clips=2, sampling="random")):
        loader = fastload.DataLoader(root / "out", batch_size=1, clip=clip, transform=[T.Resize(truth[0].shape[:2])], fields=[field])
        for epoch in range(3):
            loader.set_epoch(epoch)
            (clips,) = next(iter(loader))
            for c, (first, _, _, _) in enumerate(loader.describe(0, epoch).samples[0].clips):
                for t in range(clip.frames):
                    frame = truth[min(first + clip.stride * t, len(truth) - 1)]
                    assert torch.equal(clips[0, c, t], torch.from_numpy(frame).permute(2, 0, 1)), (clip, epoch, first, t)


@pytest.mark.parametrize("gop", [1, 4])
def test_clips_from_frame_0_of_an_avi_whose_keyframes_show_after_they_decode(tmp_path: Path, gop: int) -> None:
    """MPEG-4 ASP with B-frames in AVI: the first keyframe has pts 1, dts 0, and a seek to a
    keyframe's pts landed on a later one (its dts is no later), so clips were shifted. Where each
    seek lands is checked, early or late, and a late one starts again from the keyframe before."""
    from tests.video.media import camera_frames, ffmpeg_encode

    data = ffmpeg_encode(camera_frames(6, 40, 96, 64), ".avi", "-c:v", "mpeg4", "-bf", "2", "-g", str(gop), "-q:v", "4")
    assert_clips_decode_as_from_the_start(tmp_path, "asp.avi", data)


@pytest.mark.parametrize("codec, container, name", [("mpeg2video", "vob", "ps2.mpg"), ("mpeg1video", "mpeg", "ps1.mpeg"),
                                                    ("mpeg2video", "mpeg2video", "es.mpv")])
def test_clips_of_mpeg_program_and_elementary_streams_are_the_right_frames(tmp_path: Path, codec: str, container: str, name: str) -> None:
    """An MPEG program stream's seek lands anywhere, its timestamps after it guessed: clips held
    the wrong frames, or failed with 'the video ends before frame N'. Decoded from the start."""
    from tests.video.media import camera_frames, encode

    assert_clips_decode_as_from_the_start(tmp_path, name, encode(camera_frames(5, 40, 96, 64), codec=codec, container=container, gop=8, bframes=2))


def test_theora_with_repeated_frames_loads_reencodes_and_verifies(tmp_path: Path) -> None:
    """libtheora writes a held frame as an empty packet ("repeat the frame before"). The probe
    skipped them, the loader handed them to the decoder, which took the first for the stream's
    end: 'frame N does not decode' at every load, while verify --decode said OK and --reencode
    refused the video. Every decode skips them now."""
    from fastload.converters import ConvertOptions, convert
    from fastload.storage.verify import verify_dataset
    from tests.video.media import camera_frames, ffmpeg_encode

    held = [frame for frame in camera_frames(2, 10, 96, 64) for _ in range(3)]
    data = ffmpeg_encode(held, ".ogv", "-c:v", "libtheora", "-q:v", "7", "-g", "12")
    with av.open(io.BytesIO(data)) as container:
        assert sum(packet.size == 0 and packet.pts is not None for packet in container.demux(video=0)) >= 5  # the repeats
    assert_clips_decode_as_from_the_start(tmp_path, "held.ogv", data)
    assert verify_dataset(tmp_path / "out", decode=True).ok
    report = convert(str(tmp_path / "raw"), str(tmp_path / "reencoded"), ConvertOptions(source="videos", reencode_video=True), quiet=True)
    assert report.index.num_samples == 1 and fastload.open(tmp_path / "reencoded").stream_facts(0)["mp4"].frames == len(every_frame(data))


VFR_STAMPS = [0, 1, 2, 5, 6, 10, 11, 12, 20, 21, 22, 30, 40, 41, 42, 43, 50, 60, 61, 62]  # 20 frames over 63 fifteenths of a second


@pytest.mark.parametrize("codec, container, name", [("mpeg4", "avi", "vfr.avi"), ("libx264", "matroska", "vfr.mkv")])
def test_a_variable_frame_rate_video_lasts_as_long_as_its_timestamps_say(tmp_path: Path, codec: str, container: str, name: str) -> None:
    """20 frames shown over 4.2 s, their container's header saying 15 fps: the stream facts said
    1.33 s (frames over the header's rate), describe put frame 8 (shown at 1.33 s) at 0.53 s and
    inspect summed the short lengths. Times come from the timestamps; a frame is still a decoded
    picture, so clips hold the same frames as decoding from the start."""
    from tests.video.media import camera_frames, encode

    data = encode(camera_frames(7, len(VFR_STAMPS), 96, 64), codec=codec, container=container, gop=8, rate=15, stamps=VFR_STAMPS)
    with av.open(io.BytesIO(data)) as source:
        assert source.streams.video[0].average_rate == 15  # the header's rate, which a frame count over it misreads
    assert_clips_decode_as_from_the_start(tmp_path, name, data)
    facts = fastload.open(tmp_path / "out").stream_facts(0)[name.split(".")[1]]
    assert facts.frames == 20 and facts.keyframes == (0, 8, 16) and facts.seconds == pytest.approx(63 / 15, abs=0.002)
    loader = fastload.DataLoader(tmp_path / "out", batch_size=1, clip=Clip(frames=2, stride=8, clips=2, sampling="uniform"), transform=[T.Resize(SIZE)])
    first, last, start, end = loader.describe(0).samples[0].clips[0]
    assert (first, last) == (0, 8) and start == 0.0 and end == pytest.approx(VFR_STAMPS[8] / 15, abs=0.001)
    assert main(["inspect", str(tmp_path / "out")]) == 0


@pytest.mark.parametrize("codec, container", [("mpeg4", "avi"), ("libx264", "matroska")])
def test_reencoding_keeps_a_variable_frame_rate_videos_timestamps(tmp_path: Path, codec: str, container: str) -> None:
    """--reencode wrote the frames evenly at the header's rate: 20 frames over 4.2 s came out 1.33 s
    long. Each frame keeps its time (its length to within a frame: an MP4's last frame lasts what its muxer says)."""
    from fastload.converters import ConvertOptions, convert
    from tests.video.media import camera_frames, encode

    data = encode(camera_frames(9, len(VFR_STAMPS), 96, 64), codec=codec, container=container, gop=8, rate=15, stamps=VFR_STAMPS)
    (tmp_path / "raw" / "a").mkdir(parents=True)
    (tmp_path / "raw" / "a" / f"vfr.{'avi' if container == 'avi' else 'mkv'}").write_bytes(data)
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos", reencode_video=True, keyframe_interval=8), quiet=True)
    facts = fastload.open(tmp_path / "out").stream_facts(0)["mp4"]
    assert facts.frames == 20 and facts.seconds == pytest.approx(63 / 15, abs=63 / 15 / 20)
    loader = fastload.DataLoader(tmp_path / "out", batch_size=1, clip=Clip(frames=2, stride=8, clips=2, sampling="uniform"), transform=[T.Resize(SIZE)])
    assert loader.describe(0).samples[0].clips[0][3] == pytest.approx(VFR_STAMPS[8] / 15, abs=0.001)


def test_theora_held_frames_count_in_its_seconds(tmp_path: Path) -> None:
    """libtheora writes a held frame as an empty packet: the frames are the pictures decoded (the
    clips' frames), its length runs to its last timestamp, held frames included (it was the
    pictures over the rate: a third of it here)."""
    from tests.video.media import camera_frames, ffmpeg_encode

    held = [frame for frame in camera_frames(3, 10, 96, 64) for _ in range(3)]
    data = ffmpeg_encode(held, ".ogv", "-c:v", "libtheora", "-q:v", "7", "-g", "12")
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        shown = max((p.pts + p.duration) * stream.time_base for p in container.demux(stream) if p.pts is not None)
    assert_clips_decode_as_from_the_start(tmp_path, "held.ogv", data)
    facts = fastload.open(tmp_path / "out").stream_facts(0)["ogv"]
    assert facts.frames == len(every_frame(data)) < 0.8 * len(held) and shown >= 0.9 * len(held) / 24
    assert facts.seconds == pytest.approx(float(shown), abs=1e-6)


def test_the_field_video_takes_a_video_of_any_container(tmp_path: Path) -> None:
    """fields=["mp4", "cls"] fails at the first sample of another container; "video" takes any
    (the docs' example), in clips and as bytes, and describe names the container each came from."""
    from fastload.converters import ConvertOptions, convert
    from tests.video.media import camera_frames, encode

    (tmp_path / "raw" / "c").mkdir(parents=True)
    for name, codec, container in (("a.mp4", "libx264", "mp4"), ("b.mkv", "mpeg4", "matroska"), ("c.avi", "mjpeg", "avi"), ("d.mpg", "mpeg2video", "vob")):
        (tmp_path / "raw" / "c" / name).write_bytes(encode(camera_frames(len(name), 12, 96, 64), codec=codec, container=container, gop=4))
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos"), quiet=True)
    options = dict(batch_size=4, clip=Clip(frames=3, sampling="uniform"), transform=[T.Resize(SIZE)])
    with pytest.raises(fastload.SampleError, match=r"c/b: no field mp4 among \['cls'\] \(the field 'video' takes a video of any container\)"):
        next(iter(fastload.DataLoader(tmp_path / "out", fields=["mp4", "cls"], **options)))
    loader = fastload.DataLoader(tmp_path / "out", fields=["video", "cls"], **options)
    clips, labels = next(iter(loader))
    assert clips.shape == (4, 3, 3, *SIZE) and labels.tolist() == [0, 0, 0, 0]
    assert [sample.video for sample in loader.describe(0).samples] == ["mp4", "mkv", "avi", "mpg"]
    (videos,) = next(iter(fastload.DataLoader(tmp_path / "out", batch_size=4, fields={"video": "bytes"})))
    assert [v[:4] for v in videos] == [(tmp_path / "raw" / "c" / n).read_bytes()[:4] for n in ("a.mp4", "b.mkv", "c.avi", "d.mpg")]


def test_describe_names_the_video_that_stood_in_for_a_skipped_one(video_dataset: Path, tmp_path: Path) -> None:
    """With on_error="skip", describe(step) named the video that failed to decode (its stream facts
    plan fine); it names the one that took its place, as the batch's keys do, and the one it replaced."""
    copy, _, bad = with_a_broken_video(video_dataset, tmp_path, 2)
    loader = fastload.DataLoader(copy, batch_size=2, shuffle=True, seed=5, on_error="skip", num_workers=2, return_keys=True,
                                 clip=Clip(frames=3), transform=T.train(16))
    for epoch in range(2):
        loader.set_epoch(epoch)
        for step, (_, _, keys) in enumerate(loader):
            assert [sample.key for sample in loader.describe(step, epoch).samples] == keys  # the batch's own, as it arrived
    (skipped,) = loader.stats.skipped.entries
    described = [sample for epoch in range(2) for step in range(3) for sample in loader.describe(step, epoch).samples]
    assert skipped["where"] == bad and all(sample.clips for sample in described)
    assert [sample.stands_in_for for sample in described if sample.stands_in_for] == [((bad, skipped["reason"]),)] * 2
    loader.close()

"""The sound of a video's clips, ``Audio(sampling="clip")``: one crop a clip, from the presentation
time of the clip's first frame to the end of its last, at constant and variable frame rates. Each
video's sound holds its frame's number as a level for as long as that frame is shown, so a crop's
samples tell exactly which frames' times it covers; describe names the clip's seconds, and the
crops are a pure function of (seed, epoch, index): workers, resume. Lossy sound in MP4 (AAC, MP3):
a burst as each frame is shown lands where its frame starts."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import Audio, Clip
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from tests.video.media import camera_frames, encode

RATE = 8000  # the sound's samples a second, kept by the loader: a crop is the file's samples
CFR, UNIT = 25, 100  # a constant-rate video's frames a second; a variable-rate one's timestamps a second
CLIP = Clip(frames=3, stride=2, clips=2)  # 5 frames' span a clip
LATE = 5  # a variable-rate video's first frame is shown 5 units (0.05 s) after its sound starts


def durations(k: int, frames: int) -> tuple[list[int], int]:
    """Video ``k``'s frames' durations in timestamp units, and the units a second: 1/25 s each for
    an even ``k``; else varied, every frame a keyframe (so each one's timestamp is in the stream
    facts), the last frame 1 unit (its packet's duration: the facts' end of the video), the first
    shown at LATE (its sound starting at 0 s)."""
    if k % 2 == 0:
        return [1] * frames, CFR
    varied = np.random.default_rng(k).choice([2, 4, 6, 8], frames)
    return [*map(int, varied[:-1]), 1], UNIT


def level(frame: int, k: int) -> float:
    """The sound's level while frame ``frame`` of video ``k`` is shown (exact in 16-bit FLAC)."""
    return (frame + 1) / 64 + k / 1024


@pytest.fixture(scope="module")
def clip_videos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """8 Matroska videos with FLAC sound, converted (shards of 4); by key: each frame's start in
    seconds from the first one's (and the video's end), the first one's on the sound's clock, and
    the sound's samples."""
    root = tmp_path_factory.mktemp("clip-sound")
    truth = {}
    for k in range(8):
        frames = 18 + k
        spans, unit = durations(k, frames)
        starts = np.concatenate([[0], np.cumsum(spans)])
        late = 0 if unit == CFR else LATE
        sound = np.concatenate([np.zeros(late * RATE // unit, np.float32),
                                *(np.full(d * RATE // unit, level(i, k), np.float32) for i, d in enumerate(spans))])
        folder = root / "raw" / f"c{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"v{k}.mkv").write_bytes(encode(camera_frames(k, frames, 64, 48), container="matroska", rate=unit, gop=8 if unit == CFR else 1,
                                                  stamps=None if unit == CFR else [int(s) + late for s in starts[:-1]], audio_rate=RATE,
                                                  sound=sound, audio_codec="flac"))
        truth[f"c{k % 2}/v{k}"] = (starts / unit, late / unit, sound)
    convert(str(root / "raw"), str(root / "out"), ConvertOptions(source="videos", samples_per_shard=4), quiet=True)
    return root / "out", truth


def loader(path: Path, audio: Audio, clip: Clip = CLIP, **options) -> fastload.DataLoader:
    return fastload.DataLoader(path, fields={"mkv": "video", "video": "audio"}, clip=clip, audio=audio, transform=[T.Resize((48, 64))],
                               return_keys=True, **{"batch_size": 4, **options})


def check_sound_of_clips(clip_videos, made: fastload.DataLoader, audio: Audio, epochs: int) -> int:
    """Every sample of ``epochs`` epochs: each crop holds its clip's frames' sound, from its first
    frame's time to its last frame's end (or ``audio.seconds`` on), which describe names; the count checked."""
    _, truth = clip_videos
    checked = 0
    for epoch in range(epochs):
        made.set_epoch(epoch)
        for step, (_, sound, lengths, keys) in enumerate(made):
            for row, (key, described) in enumerate(zip(keys, made.describe(step, epoch).samples)):
                starts, late, samples = truth[key]
                assert described.key == key and len(described.clips) == len(described.crops) == CLIP.clips
                for c, ((first, last, t_first, t_last), (t0, t1)) in enumerate(zip(described.clips, described.crops)):
                    assert last == min(first + CLIP.span - 1, len(starts) - 2)
                    assert (t_first, t_last) == pytest.approx((starts[first], starts[last]), abs=1e-6)
                    end = min(starts[last + 1], starts[first] + audio.seconds)
                    assert t0 == t_first and (t0, t1) == pytest.approx((starts[first], end), abs=1e-6)  # the crop's seconds: its clip's
                    a = round((late + starts[first]) * RATE)  # on the sound's clock
                    valid = round((late + end) * RATE) - a
                    assert lengths[row, c] == valid
                    got = sound[row, c, 0].numpy()
                    np.testing.assert_array_equal(got[:valid], samples[a : a + valid])  # exactly its frames' sound
                    shown_last = last if end == starts[last + 1] else np.searchsorted(starts, end, "left") - 1  # cut: the frame shown then
                    assert got[0] == level(first, int(key[-1])) and got[valid - 1] == level(int(shown_last), int(key[-1]))
                    assert not got[valid:].any()
                checked += 1
    return checked


@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_clip_has_the_sound_of_its_frames_by_their_timestamps_and_describe_names_its_seconds(clip_videos, num_workers: int) -> None:
    audio = Audio(seconds=0.5, rate=RATE, crops=2, sampling="clip")
    made = loader(clip_videos[0], audio, shuffle=True, seed=4, num_workers=num_workers)
    assert check_sound_of_clips(clip_videos, made, audio, epochs=2) == 16
    evaluation = loader(clip_videos[0], audio, clip=Clip(frames=3, stride=2, clips=2, sampling="uniform"))
    assert check_sound_of_clips(clip_videos, evaluation, audio, epochs=1) == 8


def test_a_clip_longer_than_a_crop_has_its_first_seconds_and_lengths_say_how_many(clip_videos) -> None:
    audio = Audio(seconds=0.1, rate=RATE, crops=2, sampling="clip")  # a 5-frame span lasts 0.2 s at 25 fps, 0.1 s to 0.34 s varied
    made = loader(clip_videos[0], audio, shuffle=True, seed=9)
    assert check_sound_of_clips(clip_videos, made, audio, epochs=1) == 8
    _, sound, lengths, _ = next(iter(made))
    assert sound.shape == (4, 2, 1, 800) and int(lengths.max()) == 800


@pytest.mark.parametrize("taken", [0, 1])
def test_resume_mid_epoch_gives_the_same_clips_and_sound(clip_videos, taken: int) -> None:
    """Batches of (clips, sound, lengths, keys): the rest of an epoch resumed equals an uninterrupted run's."""
    audio = Audio(seconds=0.5, rate=RATE, crops=2, sampling="clip")

    def made() -> fastload.DataLoader:
        return loader(clip_videos[0], audio, shuffle=True, seed=5, num_workers=1, batch_size=2)

    with made() as whole:
        whole.set_epoch(3)
        uninterrupted = list(whole)
    with made() as first:
        first.set_epoch(3)
        before = list(itertools.islice(iter(first), taken))
        state = first.state_dict()
    with made() as resumed:
        resumed.load_state_dict(state)
        after = list(resumed)
    assert len(uninterrupted) == 4 and len(after) == 4 - taken
    for got, want in zip(before + after, uninterrupted, strict=True):
        assert got[3] == want[3] and all(torch.equal(a, b) for a, b in zip(got[:3], want[:3]))


def test_clip_sampling_asks_for_the_loaders_clip_and_one_crop_a_clip(clip_videos) -> None:
    path = clip_videos[0]
    with pytest.raises(ValueError, match=r"Audio\(sampling='clip'\) crops the sound of each clip of a video: give the loader clip="):
        fastload.DataLoader(path, batch_size=2, fields={"mkv": "audio"}, audio=Audio(sampling="clip"))
    with pytest.raises(ValueError, match=r"Audio\(sampling='clip'\) takes one crop a clip: crops=2 for a Clip of 2 clips, got 1"):
        loader(path, Audio(seconds=0.5, sampling="clip"))
    with pytest.raises(ValueError, match="Audio clip= is the clips sampling='clip' follows"):
        Audio(clip=Clip(), sampling="random")
    with pytest.raises(ValueError, match="short='drop' does not apply"):
        Audio(sampling="clip", short="drop")
    with pytest.raises(ValueError, match="is not the loader's clip="):
        loader(path, Audio(seconds=0.5, crops=2, sampling="clip", clip=Clip(frames=4, clips=2)))


def test_a_video_without_sound_is_a_skipped_sample_named_with_its_reason(tmp_path: Path) -> None:
    (tmp_path / "raw" / "a").mkdir(parents=True)
    frames = camera_frames(1, 24, 64, 48)
    (tmp_path / "raw" / "a" / "with.mp4").write_bytes(encode(frames, audio_rate=16000))
    (tmp_path / "raw" / "a" / "without.mp4").write_bytes(encode(frames))
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos"), quiet=True)
    options = dict(batch_size=1, fields={"mp4": "video", "video": "audio"}, clip=Clip(frames=4), transform=[T.Resize((48, 64))],
                   audio=Audio(seconds=0.5, rate=8000, sampling="clip"), return_keys=True)
    with pytest.raises(fastload.SampleError, match="without: field mp4: a video with no audio stream, and its audio was asked for"):
        list(fastload.DataLoader(tmp_path / "out", **options))
    made = fastload.DataLoader(tmp_path / "out", on_error="skip", **options)
    assert [keys for *_, keys in made] == [["a/with"]] * 2
    assert [e["reason"] for e in made.stats.skipped.entries] == ["field mp4: a video with no audio stream, and its audio was asked for"]
    first, second = made.describe(0).samples[0], made.describe(1).samples[0]
    assert second.stands_in_for == (("shard-00000.tar:a/without", "field mp4: a video with no audio stream, and its audio was asked for"),)
    for described in (first, second):
        ((_, _, t0, _),) = described.clips
        assert described.key == "a/with" and described.crops[0] == pytest.approx((t0, t0 + 4 / 24), abs=1e-6)  # 4 frames at 24 fps


@pytest.mark.parametrize("audio_codec", ["aac", "libmp3lame"])
def test_in_an_mp4_with_lossy_sound_each_frames_burst_starts_where_its_frame_is_shown(tmp_path: Path, audio_codec: str) -> None:
    """A 5 ms 2 kHz burst as each frame is shown, AAC or MP3 in MP4 (their encoders' delay undone by
    the container): in each clip's sound, the bursts lie one frame apart from the crop's first sample
    (to within 2 samples; crops after the first are decoded after a seek)."""
    rate, fps = 16000, 25
    burst = (0.5 * np.sin(2 * np.pi * 2000 * np.arange(80) / rate)).astype(np.float32)
    sound = np.zeros(2 * rate, np.float32)
    for frame in range(2 * fps):
        sound[frame * rate // fps : frame * rate // fps + 80] = burst
    (tmp_path / "raw" / "a").mkdir(parents=True)
    (tmp_path / "raw" / "a" / "v.mp4").write_bytes(encode(camera_frames(2, 2 * fps, 64, 48), rate=fps, audio_rate=rate, sound=sound,
                                                          audio_codec=audio_codec))
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos"), quiet=True)
    made = fastload.DataLoader(tmp_path / "out", batch_size=1, fields={"mp4": "video", "video": "audio"}, transform=[T.Resize((48, 64))],
                               clip=Clip(frames=4, clips=3, sampling="uniform"), audio=Audio(seconds=0.5, rate=rate, crops=3, sampling="clip"))
    _, crops, lengths = next(iter(made))
    assert [t0 for t0, _ in made.describe(0).samples[0].crops] == [0.0, 0.92, 1.84]  # frames 0, 23, 46: two crops after a seek
    for crop, valid in zip(crops[0, :, 0].numpy(), lengths[0].tolist(), strict=True):
        assert valid == 4 * rate // fps
        padded = np.concatenate([np.zeros(100, np.float32), crop[:valid], np.zeros(100, np.float32)])
        match = np.correlate(padded, burst, "valid")
        found = [int(np.argmax(match[k * rate // fps : k * rate // fps + 200])) - 100 for k in range(4)]
        assert all(abs(offset) <= 2 for offset in found), found

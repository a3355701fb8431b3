"""Crops of the codecs decoded through FFmpeg's demuxer and a seek (MP3, FLAC, Opus in Ogg and in
WebM, AAC in M4A and a video's sound track in Matroska), each compared with the recording decoded
whole from its start, where describe places it: at the recording's own rate and channels (nothing
resampled), several crops a recording, evenly spaced (its first, its last, between) and random ones.
Equal sample for sample where a decoder's state after a seek can equal a decode from the start
(MP3 after its bit reservoir's pre-roll, FLAC, AAC); Opus within its decoder's convergence; in
Matroska and WebM (millisecond timestamps) placed by its packets counted from the start. AAC is encoded without
noise substitution here: the noise FFmpeg's decoder substitutes is drawn from a generator a seek
does not rewind, so those bands differ after any seek (as loud as the noise they stand for)."""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest

import fastload
from fastload import Audio
from fastload.av.pyav import _Gathered
from fastload.converters import ConvertOptions, convert
from tests.audio.media import chirp, encode

# name: (extension, rate, channels, seconds, bit rate or None for the encoder's default, tolerance)
RECORDINGS: dict[str, tuple[str, int, int, float, int | None, float]] = {
    "mp3-8k-8kbps": ("mp3", 8000, 1, 8.0, 8000, 0.0),  # 0.25 s of pre-roll left crops 0.5 off for 0.24 s
    "mp3-24k-16kbps": ("mp3", 24000, 2, 6.0, 16000, 0.0),
    "mp3-44k": ("mp3", 44100, 2, 4.0, None, 0.0),
    "flac-44k": ("flac", 44100, 2, 4.0, None, 0.0),
    "opus-16kbps": ("opus", 48000, 1, 6.0, 16000, 1e-5),  # 0.25 s of pre-roll: 7e-4 off
    "weba": ("weba", 48000, 2, 5.0, None, 1e-5),  # millisecond timestamps: crops came 24 samples early (0.68 off)
    "opus-last-page": ("opus", 48000, 1, 6.9, None, 1e-5),  # a last page of 0.9 s: see the test below
    "weba-vorbis": ("weba", 44100, 2, 4.0, None, 0.0),  # packets of two sizes: counted by decoding from the start
    "m4a-44k": ("m4a", 44100, 1, 5.0, None, 0.0),
}


def _decoded_whole(data: bytes) -> np.ndarray:
    """(channels, n) float32 in [-1, 1]: every frame FFmpeg's demuxer and decoder give for ``data``'s first audio stream, from its start."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        gathered = _Gathered("whole", stream.codec_context.channels)
        for frame in container.decode(stream):
            gathered.add(frame, 0, frame.samples)
    return gathered.samples()


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """RECORDINGS (a chirp with noise in it, so that no stretch repeats) converted into shards, and each decoded whole, by key."""
    root = tmp_path_factory.mktemp("crops")
    whole = {}
    for i, (name, (ext, rate, channels, seconds, bit_rate, _)) in enumerate(RECORDINGS.items()):
        (root / "raw" / name).mkdir(parents=True)
        samples = chirp(rate, seconds, channels, seed=i)
        samples += 0.05 * np.random.default_rng(i).standard_normal(samples.shape).astype(np.float32)
        data = encode(samples, rate, ext, "vorbis" if name == "weba-vorbis" else None, bit_rate, {"aac_pns": "0"} if ext == "m4a" else None)
        (root / "raw" / name / f"r.{ext}").write_bytes(data)
        whole[f"{name}/r"] = _decoded_whole(data)
    convert(str(root / "raw"), str(root / "out"), ConvertOptions(source="audio"), quiet=True)
    return root / "out", whole


def _check_crops(dataset: Path, whole: dict[str, np.ndarray], key: str, rate: int, channels: int, tolerance: float,
                 fields: dict[str, str] | None = None, seconds: float = 0.5, uniform: int = 7) -> int:
    """Every crop of ``key`` in ``dataset`` (uniform ones, then random ones over three epochs) against
    its recording decoded whole where describe places it; the crops checked."""
    checked = 0
    for audio, epochs in ((Audio(seconds=seconds, crops=uniform, sampling="uniform", rate=rate, channels=channels), 1),
                          (Audio(seconds=seconds, crops=4, sampling="random", rate=rate, channels=channels), 3)):
        loader = fastload.DataLoader(dataset, batch_size=1, shuffle=True, seed=3, return_keys=True, audio=audio, fields=fields)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for step, batch in enumerate(loader):
                samples, lengths, keys = batch[0], batch[1], batch[-1]
                if keys[0] != key:
                    continue
                truth = whole[key]
                for crop, (start_s, _) in enumerate(loader.describe(step, epoch).samples[0].crops):
                    start, length = round(start_s * rate), int(lengths[0, crop])
                    assert length == audio.length, (key, crop)
                    got, want = samples[0, crop, :, :length].numpy(), truth[:, start : start + length]
                    if tolerance:
                        assert float(np.abs(got - want).max()) <= tolerance, (key, epoch, crop, start, float(np.abs(got - want).max()))
                    else:
                        assert np.array_equal(got, want), (key, epoch, crop, start, float(np.abs(got - want).max()))
                    checked += 1
    return checked


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(RECORDINGS))
def test_crops_after_a_seek_are_the_recording_decoded_whole(recordings, name: str) -> None:
    """Each codec's crops equal its whole decode (exactly, or within the tolerance its decoder allows)."""
    dataset, whole = recordings
    _, rate, channels, _, _, tolerance = RECORDINGS[name]
    assert _check_crops(dataset, whole, f"{name}/r", rate, channels, tolerance) == 7 + 3 * 4


@pytest.mark.timeout(240)
def test_ogg_opus_crops_on_its_last_page_after_other_crops_are_placed_right(recordings) -> None:
    """40 short crops (10 ms, 0.17 s apart) of an Ogg Opus recording whose last page holds 0.9 s, from
    one container: a seek onto the last page after another crop's seek there, where FFmpeg's Ogg
    demuxer timed the packets up to 0.7 s early (the crop came out wrong, or the recording "ended"
    before its sample table said); the container is opened again before each seek."""
    dataset, whole = recordings
    assert _check_crops(dataset, whole, "opus-last-page/r", 48000, 1, 1e-5, seconds=0.01, uniform=40) == 40 + 3 * 4


@pytest.mark.timeout(240)
@pytest.mark.parametrize("codec", ["aac", "flac"])
def test_a_matroska_videos_sound_track_crops_are_placed_to_the_sample(tmp_path: Path, codec: str) -> None:
    """A video's AAC (without noise substitution, as above) or FLAC sound track in Matroska
    (millisecond timestamps: after a seek, AAC crops came up to 22 samples off; FLAC's were decoded
    from the start) loads as its decode from the start does, sample for sample."""
    from tests.video.media import camera_frames
    from tests.video.media import encode as encode_video

    (tmp_path / "raw" / "a").mkdir(parents=True)
    data = encode_video(camera_frames(1, 96, 32, 32), container="matroska", audio_rate=44100, audio_codec=codec,  # 4 s of a 440 Hz tone
                        audio_options={"aac_pns": "0"} if codec == "aac" else None)
    (tmp_path / "raw" / "a" / "v.mkv").write_bytes(data)
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos"), quiet=True)
    whole = {"a/v": _decoded_whole(data)}
    assert _check_crops(tmp_path / "out", whole, "a/v", 44100, whole["a/v"].shape[0], 0.0, fields={"mkv": "audio"}) == 7 + 3 * 4


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("ext", "container", "video_codec", "audio_codec", "rate", "tolerance"), [
    ("webm", "webm", "libvpx", "libopus", 48000, 1e-5),  # 0.25 s of pre-roll instead of Opus's 0.5: 7e-4 off
    ("mkv", "matroska", "libx264", "libmp3lame", 8000, 0.0),  # 8 kbps: 0.25 s instead of twice its bit reservoir (0.8 s)
])
def test_a_videos_sound_track_gets_its_codecs_pre_roll(tmp_path: Path, ext: str, container: str, video_codec: str,
                                                       audio_codec: str, rate: int, tolerance: float) -> None:
    """A video's sound track (whose stream facts name no audio codec) in Opus, and in MP3 at 8 kbps,
    is pre-rolled as its codec needs after a seek: its crops equal its decode from the start (Opus
    within its decoder's convergence)."""
    from tests.video.media import camera_frames
    from tests.video.media import encode as encode_video

    (tmp_path / "raw" / "a").mkdir(parents=True)
    sound = chirp(rate, 4.0, 1, seed=7)[0]
    sound += 0.05 * np.random.default_rng(7).standard_normal(sound.shape).astype(np.float32)
    data = encode_video(camera_frames(1, 96, 32, 32), codec=video_codec, container=container, audio_rate=rate, sound=sound,
                        audio_codec=audio_codec)
    (tmp_path / "raw" / "a" / f"v.{ext}").write_bytes(data)
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos"), quiet=True)
    whole = {"a/v": _decoded_whole(data)}
    assert _check_crops(tmp_path / "out", whole, "a/v", rate, 1, tolerance, fields={ext: "audio"}) == 7 + 3 * 4

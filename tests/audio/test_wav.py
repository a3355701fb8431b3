"""PCM WAV crops read at their bytes (fastload.av.wav), without a decoder: every sample format
FFmpeg writes in WAV (plain and extensible headers), a chunk after the data, a stereo file mixed
down and resampled; and a sample table that lies about a WAV is a bad sample by name, as for any
recording."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload import Audio
from fastload.converters import ConvertOptions, convert
from tests.audio.media import chirp, encode
from tests.audio.test_hostile import _tampered_copy
from tests.hostile_data import run_limited

# (file name, PCM encoder, channels, rate, the largest step between the stored sample and the truth)
WAVS = (("s16.wav", "pcm_s16le", 2, 16000, 1 / 32768), ("u8.wav", "pcm_u8", 1, 16000, 1 / 128),
        ("s24.wav", "pcm_s24le", 3, 16000, 1 / 2**23), ("s32.wav", "pcm_s32le", 1, 16000, 1 / 2**31),
        ("f32.wav", "pcm_f32le", 2, 16000, 0.0), ("f64.wav", "pcm_f64le", 1, 16000, 0.0), ("rate.wav", "pcm_s16le", 1, 22050, 1 / 32768),
        ("tail.wav", "pcm_s16le", 1, 16000, 1 / 32768))


def _with_chunk_after_data(data: bytes) -> bytes:
    """``data`` (a WAV) with a LIST chunk after its data chunk, the RIFF size grown to hold it."""
    chunk = b"LIST" + struct.pack("<I", 12) + b"INFOISFT" + struct.pack("<I", 0)
    out = bytearray(data + chunk)
    out[4:8] = struct.pack("<I", len(out) - 8)
    return bytes(out)


@pytest.mark.timeout(120)
def test_pcm_wav_crops_are_the_stored_samples_read_without_pyav(tmp_path: Path) -> None:
    """Each WAV's centred 0.5 s crop (at 16 kHz: stereo mixed down, 22.05 kHz resampled), loaded in a
    process where PyAV cannot be imported, equals the samples written, within the format's step."""
    truth = {}
    for i, (name, encoder, channels, rate, _) in enumerate(WAVS):
        samples = chirp(rate, 1.5, channels, seed=i)
        data = encode(samples, rate, "wav", encoder)
        folder = tmp_path / "raw" / f"c{i}"
        folder.mkdir(parents=True)
        (folder / name).write_bytes(_with_chunk_after_data(data) if name == "tail.wav" else data)
        truth[name] = samples
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="audio"), quiet=True)
    result = run_limited(f"""
        import json, sys
        sys.modules["av"] = None  # any import of PyAV fails
        import fastload
        loader = fastload.DataLoader({str(tmp_path / "out")!r}, batch_size=1, return_keys=True,
                                     audio=fastload.Audio(seconds=0.5, rate=16000, sampling="centred"))
        crops = {{}}
        for step, (samples, lengths, labels, keys) in enumerate(loader):
            start = loader.describe(step, 0).samples[0].crops[0][0]
            crops[keys[0]] = (start, lengths.tolist(), samples[0, 0].tolist())
        print(json.dumps(crops))
    """)
    assert len(result) == len(WAVS)
    for key, (start_s, lengths, crop) in result.items():
        name = key.split("/")[1] + ".wav"
        _, _, channels, rate, step = next(w for w in WAVS if w[0] == name)
        mono = truth[name].mean(axis=0)
        got = np.asarray(crop, np.float32)
        assert lengths == [8000]
        if rate == 16000:
            start = round(start_s * rate)
            assert np.abs(got - mono[start : start + 8000]).max() <= step + 1e-6, name
        else:  # resampled: aligned with the tone interpolated at the crop's instants, but for the filter's edges
            times = start_s + np.arange(8000) / 16000
            want = np.interp(times * rate, np.arange(mono.size), mono)
            assert np.abs(got - want)[64:-64].max() < 0.02, name


@pytest.fixture(scope="module")
def wav_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 2 s mono 16-bit WAV at 16 kHz, converted."""
    root = tmp_path_factory.mktemp("wav")
    (root / "raw" / "c0").mkdir(parents=True)
    (root / "raw" / "c0" / "r0.wav").write_bytes(encode(chirp(16000, 2.0, 1), 16000, "wav"))
    convert(str(root / "raw"), str(root / "out"), ConvertOptions(source="audio"), quiet=True)
    return root / "out"


@pytest.mark.parametrize("values, message", [
    ({4: 10 * 16000}, r"shard-00000.tar:c0/r0: ends at 2.00 s, its sample table says 10.00 s$"),
    ({2: 2, 3: 44100, 4: 2 * 44100}, r"shard-00000.tar:c0/r0: decodes to 16000 Hz, 1 channels; its sample table says 44100 Hz, 2$"),
])
def test_a_table_lying_about_a_wav_is_a_bad_sample_by_name(wav_dataset: Path, tmp_path: Path, values: dict[int, int], message: str) -> None:
    copy = _tampered_copy(wav_dataset, tmp_path, values)
    loader = fastload.DataLoader(copy, batch_size=1, audio=Audio(seconds=4.0, sampling="start"))
    with pytest.raises(fastload.SampleError, match=message):
        next(iter(loader))

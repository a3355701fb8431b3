"""Bad recordings: truncated and corrupt files of every codec, zero-length files, headers declaring
absurd rates, channel counts or lengths, files that are no recording, sample tables promising what
a file does not hold. Each is a one-line sample error naming the file, in bounded memory (RLIMIT_AS):
nothing is allocated from a declared size."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload import Audio
from fastload.formats.index import read_index
from fastload.formats.table import SampleTable
from tests.audio.media import CODECS, recording
from tests.hostile_data import run_limited


def _patched(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


@pytest.fixture(scope="module")
def hostile_recordings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT/c: a good recording of each codec, each truncated to half its bytes and with its middle
    third overwritten by noise, and WAVs whose headers lie; a PNG named .flac, an empty .mp3."""
    root = tmp_path_factory.mktemp("hostile-audio")
    (root / "c").mkdir()
    files: dict[str, bytes] = {}
    for ext in CODECS:
        data, _ = recording(ext, 2.0)
        third = len(data) // 3
        files[f"good.{ext}"] = data
        files[f"half.{ext}"] = data[: len(data) // 2]
        files[f"noise.{ext}"] = data[:third] + bytes((i * 37 + 11) % 256 for i in range(third)) + data[2 * third :]
    wav, _ = recording("wav", 1.0)
    fmt = wav.index(b"fmt ")
    files["rate.wav"] = _patched(wav, fmt + 12, "<I", 1_000_000)  # 1 MHz
    files["channels.wav"] = _patched(wav, fmt + 10, "<H", 100)
    files["length.wav"] = _patched(wav, wav.index(b"data") + 4, "<I", 0x7FFFFFF0)  # 11 hours of samples declared, 1 s held
    files["empty.mp3"] = b""
    files["image.flac"] = b"\x89PNG\r\n\x1a\n" + bytes(200)
    for name, data in files.items():
        (root / "c" / name).write_bytes(data)
    return root


DOES_NOT_DECODE = r"does not decode at \d+\.\d\d s \(InvalidDataError\)$"
UNREADABLE = r"not a readable recording \((InvalidDataError|EOFError)\)$"
EXPECTED = {  # what FFmpeg can tell of each damage (a regular expression of the reason); the rest decode as what they hold
    "half.flac": DOES_NOT_DECODE,
    "noise.flac": DOES_NOT_DECODE,
    "half.wav": r"truncated or a lying header: its data chunk declares 64000 bytes, the file holds \d+$",
    "half.mp3": r"truncated or a lying header: it declares 2\.00 s and decodes to 0\.9\d s$",
    "noise.mp3": DOES_NOT_DECODE,
    "half.ogg": UNREADABLE,
    "noise.ogg": UNREADABLE,
    "noise.opus": r"truncated or a lying header: it declares 2\.01 s and decodes to 0\.\d\d s$",
    "half.m4a": UNREADABLE,
    "noise.m4a": DOES_NOT_DECODE,
    "rate.wav": r"its header declares 1000000 samples a second \(fastload reads 1 to 768000\)$",
    "channels.wav": r"its header declares 100 channels \(fastload reads 1 to 64\)$",
    "length.wav": r"truncated or a lying header: its data chunk declares 2147483632 bytes, the file holds 32000$",
    "empty.mp3": r"empty recording: zero bytes$",
    "image.flac": r"its format \(png_pipe\) is not an audio container fastload reads \(FLAC, WAV",
}


@pytest.mark.timeout(120)
def test_bad_recordings_are_skipped_at_conversion_one_line_each_in_bounded_memory(hostile_recordings: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_limited(f"""
        import json
        from fastload.converters import ConvertOptions, convert
        report = convert({str(hostile_recordings)!r}, {str(out)!r}, ConvertOptions(source="audio", on_error="skip"), quiet=True)
        print(json.dumps({{"samples": report.index.num_samples}}))
    """, memory_bytes=1 << 30)
    reasons = {Path(entry["where"]).name: entry["reason"] for entry in map(json.loads, (out / "skipped.jsonl").read_text().splitlines())}
    assert set(reasons) == set(EXPECTED), sorted(reasons)
    for name, reason in reasons.items():
        assert re.match(EXPECTED[name], reason) and "\n" not in reason, (name, reason)
    # PCM holds no structure to damage, and an Ogg file cut at a page is a shorter one: they convert as what they hold
    ds = fastload.open(out)
    kept = {}
    for i in range(len(ds)):
        ((ext, facts),) = ds.stream_facts(i).items()
        kept[f"{ds.key_of(i).split('/')[1].split('_')[0]}.{ext}"] = facts  # keys: good, good_1, ... (names made unique)
    assert result["samples"] == len(kept) and sorted(kept) == sorted([*(f"good.{ext}" for ext in CODECS), "noise.wav", "half.opus"])
    assert kept["half.opus"].seconds == pytest.approx(1.0, abs=0.1)


def _tampered_copy(dataset: Path, tmp_path: Path, values: dict[int, int]) -> Path:
    """A copy of ``dataset`` whose sample table's first row of facts holds ``values`` (column -> value)."""
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    shard = read_index(copy).shards[0]
    table = SampleTable(copy / shard.table, shard.samples)
    at = table.schema.facts_at
    table.close()
    raw = bytearray((copy / shard.table).read_bytes())
    for column, value in values.items():
        raw[at + column * 8 : at + (column + 1) * 8] = np.int64(value).tobytes()
    (copy / shard.table).write_bytes(bytes(raw))
    return copy


def test_a_table_promising_samples_the_file_lacks_is_a_bad_sample_by_name(audio_dataset: Path, tmp_path: Path) -> None:
    copy = _tampered_copy(audio_dataset, tmp_path, {4: 10 * 16000})  # the first recording (2 s of FLAC) said to last 10 s
    loader = fastload.DataLoader(copy, batch_size=1, audio=Audio(seconds=4.0, sampling="start"))
    with pytest.raises(fastload.SampleError, match=r"shard-00000.tar:c0/r0: ends at 2.00 s, its sample table says 10.00 s"):
        next(iter(loader))


@pytest.mark.timeout(120)
def test_a_table_declaring_a_huge_rate_and_channels_allocates_nothing_from_them(audio_dataset: Path, tmp_path: Path) -> None:
    """64 channels at 768 kHz for 20 s, says the table: a 10 s crop would be 1.97 GB of float32 if
    allocated from its word; the decoder's frames say otherwise first, under a 1.5 GiB address-space cap."""
    final = _tampered_copy(audio_dataset, tmp_path, {2: 64, 3: 768_000, 4: 20 * 768_000})
    result = run_limited(f"""
        import json
        import fastload
        loader = fastload.DataLoader({str(final)!r}, batch_size=1, audio=fastload.Audio(seconds=10.0, rate=8000))
        try:
            next(iter(loader))
            print(json.dumps({{"error": None}}))
        except fastload.SampleError as exc:
            print(json.dumps({{"error": str(exc)}}))
    """, memory_bytes=3 << 29)
    assert result["error"] == "shard-00000.tar:c0/r0: decodes to 16000 Hz, 1 channels; its sample table says 768000 Hz, 64"

"""Ogg Vorbis crops decoded without the demuxer (fastload.av.ogg): the pages walked by their
headers, the packet ending the page before a crop fed first to a bare decoder. Every crop is the
recording as FFmpeg decodes it whole, sample for sample, at several rates, at its start, its end and
between, several crops a recording; Ogg bytes tampered with in a shard are a bad sample by name, in
bounded memory."""

from __future__ import annotations

import io
import re
import shutil
import struct
from pathlib import Path

import av
import numpy as np
import pytest

import fastload
from fastload import Audio
from fastload.converters import ConvertOptions, convert
from tests.audio.media import chirp, encode
from tests.hostile_data import run_limited

RATES = (8000, 22050, 44100, 48000)
SECONDS = (6.0, 0.2, 2.5)  # a recording of many pages, one of a single page (shorter than a crop), one between


def _vorbis(rate: int, seconds: float, seed: int) -> bytes:
    """A stereo chirp with a click every third of a second, as Ogg Vorbis (FFmpeg's encoder)."""
    samples = chirp(rate, seconds, 2, seed)
    samples[:, :: rate // 3] = 0.9
    return encode(samples, rate, "ogg")


def _decoded_whole(data: bytes) -> np.ndarray:
    """(channels, n) float32: every frame FFmpeg's demuxer and decoder give for ``data``, from its start."""
    with av.open(io.BytesIO(data)) as container:
        return np.concatenate([frame.to_ndarray() for frame in container.decode(audio=0)], axis=1)


@pytest.fixture(scope="module")
def vorbis_sets(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, dict[str, np.ndarray]]]:
    """For each of RATES: the recordings of SECONDS converted, and each one decoded whole, by key."""
    sets = {}
    for rate in RATES:
        root = tmp_path_factory.mktemp(f"vorbis{rate}")
        (root / "raw" / "c0").mkdir(parents=True)
        whole = {}
        for i, seconds in enumerate(SECONDS):
            data = _vorbis(rate, seconds, seed=i)
            (root / "raw" / "c0" / f"r{i}.ogg").write_bytes(data)
            whole[f"c0/r{i}"] = _decoded_whole(data)
        convert(str(root / "raw"), str(root / "out"), ConvertOptions(source="audio"), quiet=True)
        sets[rate] = (root / "out", whole)
    return sets


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rate", RATES)
def test_vorbis_crops_are_the_recording_decoded_whole_sample_for_sample(vorbis_sets, rate: int) -> None:
    """Nine evenly spaced crops a recording (its first, its last, between) and random ones over three
    epochs, at the recording's own rate and channels (nothing resampled): each crop equals the whole
    recording's decode where describe places it, exactly; a recording shorter than a crop is all of it.
    (Through the demuxer, a crop on the last page after a seek in the same container came out misplaced.)"""
    dataset, whole = vorbis_sets[rate]
    checked = 0
    for audio, epochs in ((Audio(seconds=0.5, crops=9, sampling="uniform", rate=rate, channels=2), 1),
                          (Audio(seconds=0.5, crops=4, sampling="random", rate=rate, channels=2), 3)):
        loader = fastload.DataLoader(dataset, batch_size=1, shuffle=True, seed=5, return_keys=True, audio=audio)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for step, (samples, lengths, _, keys) in enumerate(loader):
                truth = whole[keys[0]]
                for crop, (start_s, _) in enumerate(loader.describe(step, epoch).samples[0].crops):
                    start, length = round(start_s * rate), int(lengths[0, crop])
                    assert length == min(audio.length, truth.shape[1]), (keys[0], crop)
                    got = samples[0, crop, :, :length].numpy()
                    assert np.array_equal(got, truth[:, start : start + length]), (keys[0], epoch, crop, start)
                    checked += 1
    assert checked == len(SECONDS) * (9 + 3 * 4)


def _pages(data: bytes) -> list[int]:
    """Where each Ogg page of ``data`` starts."""
    at, starts = 0, []
    while at < len(data):
        starts.append(at)
        segments = data[at + 26]
        at += 27 + segments + sum(data[at + 27 : at + 27 + segments])
    return starts


def _tampered(data: bytes, how: str) -> bytes:
    """``data`` (an Ogg Vorbis file) damaged as ``how`` says, its length kept."""
    out = bytearray(data)
    pages = _pages(data)
    audio = pages[2:]  # FFmpeg's muxer: the identification header's page, then the comment and setup headers' page
    if how == "huge-page":  # a page declaring 255 segments of 255 bytes: more than the file holds
        at = audio[len(audio) // 2]
        out[at + 26] = 255
        out[at + 27 : at + 27 + 255] = b"\xff" * 255
    elif how == "noise":  # the middle third overwritten
        third = len(data) // 3
        out[third : 2 * third] = bytes((i * 37 + 11) % 256 for i in range(third))
    elif how == "setup":  # the setup header's first codebook's sync pattern broken
        at = data.index(b"BCV", data.index(b"\x05vorbis"))
        out[at : at + 3] = b"XYZ"
    elif how == "granules-huge":  # every audio page placed 100 years in
        for at in audio:
            struct.pack_into("<q", out, at + 6, 2**62)
    elif how == "granules-zero":
        for at in audio:
            struct.pack_into("<q", out, at + 6, 0)
    elif how == "packets":  # every audio page's body overwritten by noise, their headers kept
        for at in audio:
            body = at + 27 + data[at + 26]
            size = sum(data[at + 27 : body])
            out[body : body + size] = bytes((i * 91 + at) % 256 for i in range(size))
    return bytes(out)


HOW = ("huge-page", "noise", "setup", "granules-huge", "granules-zero", "packets")
DOES_NOT_DECODE = r"does not decode at \d+\.\d\d s \(InvalidDataError\)"
ENDS_EARLY = r"ends at \d+\.\d\d s, its sample table says 6\.00 s"
EXPECTED = {  # each damage's skip reason, a regular expression
    "huge-page": ENDS_EARLY,  # the pages after it are not found
    "noise": DOES_NOT_DECODE,
    "setup": r"not a readable recording \(InvalidDataError\)",
    "granules-huge": r"not a readable recording \(EOFError\)",
    "granules-zero": ENDS_EARLY,
    "packets": DOES_NOT_DECODE,
}


@pytest.mark.timeout(240)
def test_tampered_ogg_pages_in_a_shard_are_a_bad_sample_by_name_in_bounded_memory(tmp_path: Path) -> None:
    """A converted Vorbis recording whose bytes in the shard are then damaged (pages declaring more
    than the file holds, noise, a broken setup header, lying granule positions, noise packets):
    each is a one-line skip naming it (another recording standing in), never a crash or an allocation from a declared size, under a 1.5 GiB address-space cap."""
    (tmp_path / "raw" / "c0").mkdir(parents=True)
    data = _vorbis(22050, 6.0, seed=0)
    (tmp_path / "raw" / "c0" / "r0.ogg").write_bytes(data)
    (tmp_path / "raw" / "c0" / "r1.ogg").write_bytes(_vorbis(22050, 3.0, seed=1))  # left as it is: stands in for r0 when it is skipped
    convert(str(tmp_path / "raw"), str(tmp_path / "good"), ConvertOptions(source="audio"), quiet=True)
    for how in HOW:
        copy = tmp_path / how
        shutil.copytree(tmp_path / "good", copy)
        (shard,) = copy.glob("*.tar")
        raw = shard.read_bytes()
        at = raw.index(data)
        shard.write_bytes(raw[:at] + _tampered(data, how) + raw[at + len(data) :])
    result = run_limited(f"""
        import json
        import fastload
        out = {{}}
        for how in {HOW!r}:
            loader = fastload.DataLoader({str(tmp_path)!r} + "/" + how, batch_size=1, on_error="skip", max_skipped=None,
                                         return_keys=True, audio=fastload.Audio(seconds=1.0, crops=4, rate=22050, channels=2))
            keys = [key for *_, batch_keys in loader for key in batch_keys]
            out[how] = [keys, [(e["where"], e["reason"]) for e in loader.stats.skipped.entries]]
        print(json.dumps(out))
    """, memory_bytes=3 << 29)
    for how, (keys, skipped) in result.items():
        assert keys == ["c0/r1", "c0/r1"], (how, keys)
        ((where, reason),) = skipped
        assert where == "shard-00000.tar:c0/r0" and re.fullmatch(EXPECTED[how], reason), (how, where, reason)


def _mutated(data: bytes, rng: np.random.Generator, kind: int) -> bytes:
    """``data`` with a seeded damage of kind ``kind`` (0: a few bytes changed; 1: a page header's 27
    bytes replaced; 2: a capture pattern written anywhere; 3: a segment count raised), its length kept."""
    out = bytearray(data)
    if kind == 0:
        for at in rng.integers(0, len(out), int(rng.integers(1, 9))):
            out[at] = int(rng.integers(0, 256))
    else:
        pages = _pages(data)
        at = int(pages[int(rng.integers(1, len(pages)))]) if kind != 2 else int(rng.integers(0, len(out) - 4))
        if kind == 1:
            out[at : at + 27] = rng.integers(0, 256, 27, dtype=np.uint8).tobytes()
        elif kind == 2:
            out[at : at + 4] = b"OggS"
        else:
            out[at + 26] = min(255, out[at + 26] + int(rng.integers(1, 40)))
    return bytes(out)


@pytest.mark.timeout(240)
def test_seeded_damage_to_vorbis_members_is_loaded_or_skipped_by_name(tmp_path: Path) -> None:
    """48 copies of a Vorbis recording in one shard, each then damaged in place in a seeded way (bytes
    changed, page headers replaced, stray capture patterns, segment counts raised): a whole epoch of
    crops under a 1.5 GiB address-space cap ends, each copy loaded or skipped with a one-line reason naming it."""
    (tmp_path / "raw" / "c0").mkdir(parents=True)
    data = _vorbis(22050, 4.0, seed=2)
    copies = 48
    for i in range(copies):
        (tmp_path / "raw" / "c0" / f"r{i:02d}.ogg").write_bytes(data)
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="audio"), quiet=True)
    (shard,) = (tmp_path / "out").glob("*.tar")
    raw = bytearray(shard.read_bytes())
    rng = np.random.default_rng(41)
    at = 0
    for i in range(copies):
        at = raw.index(data, at)
        raw[at : at + len(data)] = _mutated(data, rng, i % 4)
        at += len(data)
    shard.write_bytes(bytes(raw))
    result = run_limited(f"""
        import json
        import fastload
        loader = fastload.DataLoader({str(tmp_path / "out")!r}, batch_size=4, on_error="skip", max_skipped=None, return_keys=True,
                                     audio=fastload.Audio(seconds=1.0, crops=3, rate=16000))
        keys = [key for *_, batch_keys in loader for key in batch_keys]
        print(json.dumps({{"keys": len(keys), "skipped": [(e["where"], e["reason"]) for e in loader.stats.skipped.entries]}}))
    """, memory_bytes=3 << 29)
    assert result["keys"] == copies
    for where, reason in result["skipped"]:
        assert re.fullmatch(r"shard-00000\.tar:c0/r\d\d", where) and reason and "\n" not in reason, (where, reason)
    assert 0 < len(result["skipped"]) < copies, result["skipped"]


@pytest.mark.timeout(120)
def test_a_chained_ogg_crop_across_its_links_is_never_silently_wrong(tmp_path: Path) -> None:
    """Two Vorbis streams chained in one file (the second's pages after the first's last): a crop
    across the link, and crops in the first link, are what FFmpeg decodes whole there, or a bad sample
    by name; never the first link's samples decoded past its end and placed as the second's."""
    (tmp_path / "raw" / "c0").mkdir(parents=True)
    data = _vorbis(22050, 2.0, seed=0) + _vorbis(22050, 2.0, seed=1)
    (tmp_path / "raw" / "c0" / "r0.ogg").write_bytes(data)
    (tmp_path / "raw" / "c0" / "r1.ogg").write_bytes(_vorbis(22050, 3.0, seed=2))  # stands in for r0 when it is skipped
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="audio"), quiet=True)
    whole = _decoded_whole(data)
    for audio in (Audio(seconds=2.1, sampling="start", rate=22050, channels=2),  # 0.1 s into the second link
                  Audio(seconds=1.0, sampling="centred", rate=22050, channels=2),  # 1.5 to 2.5 s
                  Audio(seconds=0.5, crops=3, sampling="start", rate=22050, channels=2)):
        loader = fastload.DataLoader(tmp_path / "out", batch_size=1, on_error="skip", max_skipped=None, return_keys=True, audio=audio)
        for step, (samples, lengths, _, keys) in enumerate(loader):
            if keys[0] != "c0/r0":
                continue
            crops = loader.describe(step, 0).samples[0].crops
            for crop, (start_s, _) in enumerate(crops if audio.crops > 1 else crops[:1]):
                start, length = round(start_s * 22050), int(lengths.reshape(-1)[crop])
                assert length == min(audio.length, whole.shape[1] - start), (audio, crop, length)
                got = samples.reshape(audio.crops, 2, -1)[crop, :, :length].numpy()
                assert np.array_equal(got, whole[:, start : start + length]), (audio, crop, start)
        assert all(e["where"] == "shard-00000.tar:c0/r0" and "\n" not in e["reason"] for e in loader.stats.skipped.entries)

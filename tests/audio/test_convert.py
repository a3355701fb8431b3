"""Converting recordings (--from audio: class folders, manifests with transcripts) and indexing
WebDataset tars of them in place: each recording's stream facts in the sample table."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload.av.facts import AudioFacts
from fastload.cli import main
from fastload.converters import ConvertOptions, convert
from fastload.formats.index import VIDEO_FORMAT_VERSION, read_index
from tests.audio.conftest import PLAN
from tests.audio.media import LOSSLESS, NATIVE_RATE, recording

CODEC_NAMES = {"flac": "flac", "wav": "pcm_s16le", "mp3": "mp3float", "ogg": "vorbis", "opus": "opus", "m4a": "aac"}


def test_recordings_convert_with_their_stream_facts_in_the_sample_table(audio_dataset: Path, recordings) -> None:
    _, truth = recordings
    ds = fastload.open(audio_dataset)
    index = read_index(audio_dataset)
    assert index.version == VIDEO_FORMAT_VERSION and len(ds) == len(PLAN) and index.source == "audio"
    for i in range(len(ds)):
        key = ds.key_of(i)
        number = int(key.split("/r")[1])
        ext, seconds, rate, channels = PLAN[number]
        facts = ds.stream_facts(i)[ext]
        assert isinstance(facts, AudioFacts) and facts.codec == CODEC_NAMES[ext], (key, facts)
        assert facts.rate == NATIVE_RATE.get(ext, rate) and facts.channels == channels == truth[key].shape[0] and facts.seekable
        assert 0 < facts.packets <= facts.samples
        if ext in LOSSLESS:
            assert facts.samples == truth[key].shape[1]  # every sample, counted by decoding
        else:  # encoder delay and padding trimmed where the container says (within a frame or two)
            assert abs(facts.seconds - seconds) < 0.06, (key, facts.seconds, seconds)
        assert ds.raw(i)[1]["cls"] == str(number % 2).encode()


def test_a_manifest_gives_labels_and_transcripts(tmp_path: Path) -> None:
    (tmp_path / "clips").mkdir()
    rows = []
    for i, ext in enumerate(("flac", "mp3", "opus")):
        (tmp_path / "clips" / f"u{i}.{ext}").write_bytes(recording(ext, 1.0, seed=i)[0])
        rows.append({"path": f"clips/u{i}.{ext}", "label": i, "caption": f"utterance number {i}"})
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    convert(str(tmp_path / "train.jsonl"), str(tmp_path / "out"), ConvertOptions(source="audio"), quiet=True)
    loader = fastload.DataLoader(tmp_path / "out", batch_size=3, audio=fastload.Audio(seconds=0.5, sampling="start"))
    samples, lengths, labels, texts = next(iter(loader))
    assert samples.shape == (3, 1, 8000) and lengths.tolist() == [8000] * 3
    assert sorted(zip(labels.tolist(), texts)) == [(i, f"utterance number {i}") for i in range(3)]


def _tar_of_recordings(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_tars_of_recordings_are_indexed_in_place_with_their_facts(tmp_path: Path, capsys) -> None:
    """LAION's audio sets: .flac (here also .mp3, .ogg, .opus, .m4a, .wav) beside .txt and .json;
    `fastload index` decodes each recording once for its facts and leaves the tars as they are."""
    members: dict[str, bytes] = {}
    for i, ext in enumerate(("flac", "wav", "mp3", "ogg", "opus", "m4a")):
        members[f"s{i:03d}.{ext}"] = recording(ext, 1.0 + 0.25 * i, seed=i)[0]
        members[f"s{i:03d}.txt"] = f"caption {i}".encode()
        members[f"s{i:03d}.json"] = json.dumps({"i": i}).encode()
        members[f"s{i:03d}.cls"] = str(i % 3).encode()
    members["s999.flac"] = b"fLaC" + bytes(100)  # a damaged one: no facts, a bad sample named at loading
    members["s999.txt"], members["s999.cls"] = b"damaged", b"0"
    (tmp_path / "data").mkdir()
    _tar_of_recordings(tmp_path / "data" / "part-0.tar", members)
    before = (tmp_path / "data" / "part-0.tar").read_bytes()
    with pytest.warns(UserWarning, match=r"^1 recording\(s\) do not decode .*: part-0\.tar:s999\.flac \(") as caught:
        assert main(["index", str(tmp_path / "data")]) == 0
    assert len(caught) == 1
    assert (tmp_path / "data" / "part-0.tar").read_bytes() == before
    ds = fastload.open(tmp_path / "data")
    assert read_index(tmp_path / "data").version == VIDEO_FORMAT_VERSION
    assert [sorted(ds.stream_facts(i)) for i in range(len(ds))] == [["flac"], ["wav"], ["mp3"], ["ogg"], ["opus"], ["m4a"], []]
    loader = fastload.DataLoader(tmp_path / "data", batch_size=7, audio=fastload.Audio(seconds=1.0, rate=8000), on_error="skip",
                                 return_keys=True)
    samples, lengths, labels, texts, keys = next(iter(loader))
    assert samples.shape == (7, 1, 8000) and keys[:6] == [f"s{i:03d}" for i in range(6)] and texts[0] == "caption 0"
    assert lengths.tolist() == [8000] * 7 and labels.tolist()[:6] == [i % 3 for i in range(6)]
    (entry,) = loader.stats.skipped.entries
    assert entry["where"] == "part-0.tar:s999" and "no stream facts" in entry["reason"]
    assert main(["inspect", str(tmp_path / "data")]) == 0
    assert "audio     6, flac 1, pcm_s16le 1, mp3float 1, vorbis 1, opus 1, aac 1" in capsys.readouterr().out


def test_recordings_refuse_hdf5_shards_by_name(recordings, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="videos and recordings are stored in tar shards"):
        convert(str(recordings[0]), str(tmp_path / "out"), ConvertOptions(source="audio", layout="hdf5"), quiet=True)


def test_a_damaged_audio_row_is_a_shard_error_never_a_crash(audio_dataset: Path, tmp_path: Path) -> None:
    import shutil

    from fastload.formats.table import SampleTable

    copy = tmp_path / "copy"
    shutil.copytree(audio_dataset, copy)
    shard = read_index(copy).shards[0]
    table_path = copy / shard.table
    table = SampleTable(table_path, shard.samples)
    facts_at = table.schema.facts_at
    table.close()
    raw = bytearray(table_path.read_bytes())
    raw[facts_at + 3 * 8 : facts_at + 4 * 8] = np.int64(10**9).tobytes()  # a rate of 1 GHz in the first row
    table_path.write_bytes(bytes(raw))
    with pytest.raises(fastload.ShardError, match="row 0's stream facts for .* are inconsistent"):
        SampleTable(table_path, shard.samples).stream_facts(0)


def test_verify_decode_checks_each_recordings_facts(audio_dataset: Path, tmp_path: Path) -> None:
    import hashlib
    import shutil
    from dataclasses import replace

    from fastload.formats.index import write_index
    from fastload.formats.table import SampleTable
    from fastload.storage.verify import verify_dataset

    assert verify_dataset(audio_dataset, decode=True).ok
    copy = tmp_path / "copy"
    shutil.copytree(audio_dataset, copy)
    index = read_index(copy)
    table = copy / index.shards[0].table
    parsed = SampleTable(table, index.shards[0].samples)
    facts_at = parsed.schema.facts_at
    parsed.close()
    data = bytearray(table.read_bytes())
    data[facts_at + 4 * 8 : facts_at + 5 * 8] = np.int64(31999).tobytes()  # the first recording one sample shorter
    table.write_bytes(bytes(data))
    shards = (replace(index.shards[0], table_sha256=hashlib.sha256(bytes(data)).hexdigest()), *index.shards[1:])
    write_index(copy, replace(index, shards=shards))  # a table tampered with consistently: only decoding tells
    assert verify_dataset(copy).ok
    problems = verify_dataset(copy, decode=True).problems
    assert len(problems) == 1 and problems[0].endswith("field flac: its stream facts in the sample table disagree with the recording (tampered table?)")


def test_from_wds_keeps_recordings_and_records_their_facts(tmp_path: Path) -> None:
    members: dict[str, bytes] = {}
    for i, ext in enumerate(("flac", "opus", "m4a")):  # a sample's members next to each other, as webdataset groups them
        members[f"k{i}.{ext}"], members[f"k{i}.txt"] = recording(ext, 1.0, seed=i)[0], f"said {i}".encode()
    (tmp_path / "tars").mkdir()
    _tar_of_recordings(tmp_path / "tars" / "a.tar", members)
    convert(str(tmp_path / "tars"), str(tmp_path / "out"), ConvertOptions(source="wds"), quiet=True)
    ds = fastload.open(tmp_path / "out")
    assert read_index(tmp_path / "out").version == VIDEO_FORMAT_VERSION
    assert [sorted(ds.stream_facts(i)) for i in range(len(ds))] == [["flac"], ["opus"], ["m4a"]]
    samples, lengths, texts = next(iter(fastload.DataLoader(tmp_path / "out", batch_size=3, audio=fastload.Audio(seconds=0.5))))
    assert samples.shape == (3, 1, 8000) and lengths.tolist() == [8000] * 3 and texts == ["said 0", "said 1", "said 2"]


def test_fastload_describe_names_each_crops_seconds(audio_dataset: Path, capsys) -> None:
    assert main(["describe", str(audio_dataset), "--step", "1", "--batch-size", "2", "--audio", "0.5:2", "--seed", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    loader = fastload.DataLoader(audio_dataset, batch_size=2, shuffle=True, seed=3, audio=fastload.Audio(0.5, crops=2))
    for line, sample in zip(lines, loader.describe(1, 0).samples, strict=True):
        crops = "".join(f" audio {t0:.3f}-{t1:.3f} s" for t0, t1 in sample.crops)
        assert line.endswith(f"{sample.shard}:{sample.key}{crops}") and len(sample.crops) == 2, line
    assert main(["describe", str(audio_dataset), "--step", "0", "--audio", "x"]) == 2
    assert "fastload describe: error: --audio x: expected SECONDS[:CROPS]" in capsys.readouterr().err


def test_audio_codec_and_rate_reencode_every_recording_the_same_bytes_whatever_the_workers(recordings, tmp_path: Path) -> None:
    root, truth = recordings
    for workers in (1, 2):
        assert main(["convert", str(root), str(tmp_path / f"out{workers}"), "--from", "audio", "--audio-rate", "8000",
                     "--workers", str(workers), "--quiet"]) == 0
    shards = [sorted((tmp_path / f"out{w}").glob("*.tar")) for w in (1, 2)]
    assert [p.read_bytes() for p in shards[0]] == [p.read_bytes() for p in shards[1]]
    ds = fastload.open(tmp_path / "out1")
    assert ds.index.fields == ("cls", "flac") and ds.index.conversion["audio_rate"] == 8000
    for i in range(len(ds)):
        facts = ds.stream_facts(i)["flac"]
        source = truth[ds.key_of(i)]
        assert facts.codec == "flac" and facts.rate == 8000 and facts.channels == source.shape[0]
    assert main(["convert", str(root), str(tmp_path / "opus"), "--from", "audio", "--audio-codec", "opus", "--quiet"]) == 0
    opus = fastload.open(tmp_path / "opus")
    assert opus.index.fields == ("cls", "opus") and {opus.stream_facts(i)["opus"].rate for i in range(len(opus))} == {48000}
    with pytest.raises(ValueError, match="--audio-rate 16000: Opus decodes at 48000 Hz"):
        ConvertOptions(source="audio", audio_codec="opus", audio_rate=16000)


def test_reencoding_a_lossless_recording_to_flac_keeps_every_sample(tmp_path: Path) -> None:
    data, samples = recording("wav", 1.0, 22050, 2)
    (tmp_path / "raw" / "a").mkdir(parents=True)
    (tmp_path / "raw" / "a" / "x.wav").write_bytes(data)
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="audio", audio_codec="flac"), quiet=True)
    loader = fastload.DataLoader(tmp_path / "out", batch_size=1, audio=fastload.Audio(seconds=1.0, rate=22050, channels=2, sampling="start"))
    crop, lengths, _ = next(iter(loader))
    assert lengths.tolist() == [22050] and np.abs(crop[0].numpy() - samples).max() < 2e-4  # 16-bit, as the WAV held them

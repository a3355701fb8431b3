"""Bad input to token conversion and to token shards: one clear line naming the file, row or
shard (or a counted skip with on_error="skip"), never a traceback or a silently wrong token;
and a seeded fuzz over the token format (every failure a FastloadError)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from fastload.cli.command import main
from fastload.converters import ConvertOptions, convert
from fastload.converters.options import TokenizeOptions
from fastload.errors import DatasetIndexError, FastloadError, SampleError, ShardError
from fastload.formats import open_shard
from fastload.formats.index import DatasetIndex, read_index
from fastload.storage.verify import verify_dataset
from tests.text.conftest import real_paragraphs, write_jsonl


def options(tokenizer: Path, on_error: str = "raise", shard_tokens: int = 100_000, **more) -> ConvertOptions:
    return ConvertOptions(source="jsonl", layout="tokens", on_error=on_error,
                          tokens=TokenizeOptions(str(tokenizer), shard_tokens=shard_tokens, **more))


BAD_LINES = [
    (b'{"text": "caf\xc3"}\n', "invalid UTF-8 at byte 13"),
    (b'{"text": ""}\n', "empty document (field 'text')"),
    (b'{"body": "no text field"}\n', "no 'text' field (or null)"),
    (b'{"text": ["a", "list"]}\n', "field 'text' is a list, not a string"),
    (b'{"text": "cut short\n', "not JSON (JSONDecodeError"),
    (b'[1, 2]\n', "a JSON list, not an object"),
]


@pytest.mark.parametrize("line,reason", BAD_LINES)
def test_a_bad_document_is_one_line_naming_the_file_and_line(tokenizer_file: Path, tmp_path: Path, line: bytes, reason: str, capsys) -> None:
    good = write_jsonl(tmp_path / "docs.jsonl", real_paragraphs()[:20]).read_bytes()
    (tmp_path / "docs.jsonl").write_bytes(good + line + good)
    with pytest.raises(SampleError) as raised:
        convert(str(tmp_path / "docs.jsonl"), str(tmp_path / "out"), options(tokenizer_file), quiet=True)
    assert f"docs.jsonl: line at byte {len(good)}" in str(raised.value) and reason in str(raised.value)
    code = main(["convert", str(tmp_path / "docs.jsonl"), str(tmp_path / "cli"), "--from", "jsonl", "--tokenizer", str(tokenizer_file), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and reason in err and "Traceback" not in err
    report = convert(str(tmp_path / "docs.jsonl"), str(tmp_path / "skipped"), options(tokenizer_file, on_error="skip"), quiet=True)
    assert report.index.num_samples == 40 and sum(report.index.skipped.values()) == 1
    (entry,) = [json.loads(line) for line in (tmp_path / "skipped" / "skipped.jsonl").read_text().splitlines()]
    assert reason in entry["reason"] and entry["where"].endswith(f"docs.jsonl: line at byte {len(good)}")


def test_a_gzip_stream_names_the_line_number(tokenizer_file: Path, tmp_path: Path) -> None:
    import gzip

    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(b'{"text": "fine"}\n{"text": 7}\n'))
    with pytest.raises(SampleError, match=r"d.jsonl.gz:2: field 'text' is a int"):
        convert(str(tmp_path / "d.jsonl.gz"), str(tmp_path / "out"), options(tokenizer_file), quiet=True)


def test_a_document_longer_than_a_shard_is_refused(tokenizer_file: Path, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", ["short one", " ".join(real_paragraphs()[:40])])
    with pytest.raises(SampleError, match=r"d.jsonl: line at byte \d+: \d+ tokens, more than a shard holds \(--shard-tokens 500\)"):
        convert(str(tmp_path / "d.jsonl"), str(tmp_path / "out"), options(tokenizer_file, shard_tokens=500), quiet=True)


def test_a_tokenizer_that_does_not_parse_is_named(tmp_path: Path, capsys) -> None:
    write_jsonl(tmp_path / "d.jsonl", ["text"])
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "nothing-like-it"}}')
    code = main(["convert", str(tmp_path / "d.jsonl"), str(tmp_path / "out"), "--from", "jsonl", "--tokenizer", str(tmp_path / "tokenizer.json")])
    err = capsys.readouterr().err
    assert code == 2 and "tokenizer.json: not a tokenizer.json the tokenizers library can read" in err and len(err.splitlines()) == 1


def test_append_eos_without_an_eos_token_is_refused(tokenizer_file: Path, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", ["text"])
    with pytest.raises(ValueError, match="names no bos token; give --bos-token"):
        convert(str(tmp_path / "d.jsonl"), str(tmp_path / "out"), options(tokenizer_file, bos=True), quiet=True)


@pytest.fixture(scope="module")
def token_dataset(tokenizer_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("bad-src")
    write_jsonl(src / "d.jsonl", real_paragraphs()[:300])
    out = tmp_path_factory.mktemp("bad") / "ds"
    convert(str(src), str(out), options(tokenizer_file, shard_tokens=8000), quiet=True)
    return out


def test_ids_beyond_the_vocabulary_in_a_shard_are_refused_naming_it(token_dataset: Path, tmp_path: Path) -> None:
    copy = tmp_path / "ds"
    shutil.copytree(token_dataset, copy)
    tokens = np.fromfile(copy / "shard-00001.bin", dtype="<u2")
    tokens[5] = 2000  # the vocabulary is 2,000 ids: 0..1999
    tokens.tofile(copy / "shard-00001.bin")
    index = read_index(copy)
    reader = open_shard(copy, index, index.shards[1])
    with pytest.raises(ShardError, match=r"shard-00001.bin: token id 2000 at or beyond the tokenizer's vocabulary of 2000"):
        reader.read_tokens(0, 100)  # type: ignore[attr-defined]
    problems = verify_dataset(copy).problems
    assert any("shard-00001.bin: sha256 mismatch" in p for p in problems)


def test_a_reader_of_versions_up_to_5_refuses_a_newer_index_by_its_version(token_dataset: Path) -> None:
    data = json.loads((token_dataset / "index.json").read_text())
    data["version"], data["something_new"] = 6, {"a": 1}
    with pytest.raises(DatasetIndexError, match=r"index version 6 is not supported \(this fastload reads \(1, 2, 3, 4, 5\)\)"):
        DatasetIndex.from_json(json.dumps(data))
    for older in (3, 4):  # a token dataset claiming an image or a video dataset's version
        data = json.loads((token_dataset / "index.json").read_text())
        data["version"] = older
        with pytest.raises(DatasetIndexError, match="a token dataset is of version 5"):
            DatasetIndex.from_json(json.dumps(data))


SEED = 2931
CASES = 150


def test_fuzzed_token_shards_fail_only_as_fastload_errors(token_dataset: Path, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    failures = 0
    for case in range(CASES):
        work = tmp_path / f"case{case}"
        shutil.copytree(token_dataset, work)
        target = rng.choice(["shard-00000.docs", "shard-00000.bin", "index.json"])
        data = bytearray((work / target).read_bytes())
        mutation = rng.choice(["flip", "truncate", "grow", "field"])
        if mutation == "flip" and data:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif mutation == "truncate":
            data = data[: rng.randrange(len(data) + 1)]
        elif mutation == "grow":
            data += bytes(rng.randrange(1, 64))
        elif target == "index.json":
            index = json.loads(data)
            shard = index["shards"][0]
            key = rng.choice(["tokens", "samples", "bytes", "table"])
            shard[key] = rng.choice([-1, 0, 2**63, "x", None, shard[key] + 1 if isinstance(shard[key], int) else "../up"])
            data = bytearray(json.dumps(index).encode())
        (work / target).write_bytes(bytes(data))
        try:
            index = read_index(work)
            for shard in index.shards:
                reader = open_shard(work, index, shard)
                reader.check()
                for i in range(len(reader)):
                    reader.read(i)
                reader.close()
            verify_dataset(work)
        except FastloadError:
            failures += 1
        except Exception as exc:  # anything else is a reader trusting what it should have checked
            raise AssertionError(f"case {case} ({target}, {mutation}): {type(exc).__name__}: {exc}") from exc
    assert failures > CASES // 3  # the mutations do break things, and each was caught as a FastloadError


@pytest.mark.parametrize("which", ["table", "folder"])
def test_a_document_table_reached_through_a_link_out_of_the_root_is_refused(token_dataset: Path, tmp_path: Path, which: str) -> None:
    """The table itself, or a folder on its way, is a link to an intact copy outside the dataset:
    the loader and verify refuse it by name, reading nothing there."""
    root, outside = tmp_path / "ds", tmp_path / "outside"
    shutil.copytree(token_dataset, root)
    outside.mkdir()
    table = read_index(root).shards[1].table
    shutil.move(root / table, outside / table)
    if which == "table":
        (root / table).symlink_to(outside / table)
    else:
        (root / "sub").symlink_to(outside)
        index = json.loads((root / "index.json").read_text())
        index["shards"][1]["table"] = f"sub/{table}"
        (root / "index.json").write_text(json.dumps(index))
    import fastload

    with pytest.raises(ShardError, match=rf"{table}: a symlink leads outside the dataset root"):
        for _ in fastload.DataLoader(str(root), batch_size=4, seq_len=64, packing="concat", shuffle=False):
            pass
    report = verify_dataset(root)
    assert not report.ok and any(table in problem and "outside the dataset root" in problem for problem in report.problems), report.problems

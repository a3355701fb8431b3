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
from fastload.converters.convert_options import TokenizeOptions
from fastload.converters.lock import LOCK_FILE
from fastload.errors import DatasetIndexError, FastloadError, SampleError, ShardError
from fastload.formats.index import DatasetIndex, read_index
from fastload.formats.shard_files import open_shard
from fastload.storage.verify import verify_dataset
from tests.conftest import run_cli
from tests.converters.test_confinement import link_out
from tests.hostile_data import PEAK_RSS, run_limited
from tests.text.conftest import real_paragraphs, write_jsonl
from tests.text.test_convert_tokens import documents


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
    (b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "JSON nested too deeply to read (deeper than Python's recursion limit)"),
    (b'{"text": "one \\ud800 alone"}\n', "field 'text' holds a lone surrogate at character 4, not text UTF-8 can hold"),
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
    assert not (tmp_path / "out" / LOCK_FILE).exists() and not (tmp_path / "cli" / LOCK_FILE).exists()  # a failed run leaves no lock
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


def test_documents_refused_deep_in_a_long_run_are_named_by_their_own_lines(tokenizer_file: Path, tmp_path: Path) -> None:
    """One plain chunk of 2,600 short documents (read as one run of texts, tokenized in two batches)
    with two too long for a shard among them, one in each batch: each skip names its own line's
    byte offset, and every other document is kept, in order, with the ids tokenizers gives it."""
    from tokenizers import Tokenizer

    long_text = " ".join(real_paragraphs()[:20])  # 1,000 words
    texts = [long_text if n in (100, 2300) else str(n) for n in range(2600)]
    lines = [json.dumps({"text": text}).encode() + b"\n" for text in texts]
    data = b"".join(lines)
    assert len(data) < 64 << 10  # one chunk (the least a chunk holds)
    (tmp_path / "d.jsonl").write_bytes(data)
    report = convert(str(tmp_path / "d.jsonl"), str(tmp_path / "out"), options(tokenizer_file, on_error="skip", shard_tokens=600), quiet=True)
    skipped = [json.loads(line) for line in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    offsets = [sum(map(len, lines[:n])) for n in (100, 2300)]
    assert [entry["where"] for entry in skipped] == [f"{tmp_path / 'd.jsonl'}: line at byte {offset}" for offset in offsets]
    assert all("tokens, more than a shard holds (--shard-tokens 600)" in entry["reason"] for entry in skipped)
    assert len(report.index.shards) == 1 and report.index.num_samples == 2598
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    kept = [text for text in texts if text != long_text]
    assert documents(tmp_path / "out") == [tokenizer.encode(text, add_special_tokens=False).ids for text in kept]


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


def test_a_reader_of_versions_up_to_6_refuses_a_newer_index_by_its_version(token_dataset: Path) -> None:
    data = json.loads((token_dataset / "index.json").read_text())
    data["version"], data["something_new"] = 7, {"a": 1}
    with pytest.raises(DatasetIndexError, match=r"index version 7 is not supported \(this fastload reads \(1, 2, 3, 4, 5, 6\)\)"):
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


def numbered_documents(count: int) -> bytes:
    """JSON Lines of ``count`` distinct documents of real text."""
    paragraphs = real_paragraphs()
    return "".join(json.dumps({"text": f"{n}: {paragraphs[n % len(paragraphs)]}"}) + "\n" for n in range(count)).encode()


def assert_damage_reported(tokenizer: Path, tmp_path: Path, data: bytes, name: str, reason: str, kept: int | None) -> None:
    """``data`` as ``name`` in a folder: raised, one line naming the file; skipped: the documents
    before the damage kept (``kept`` of them; None: some, not all 5,000), the rest reported in
    skipped.jsonl as lost from the line after them."""
    src = tmp_path / "src"
    src.mkdir(parents=True)
    (src / name).write_bytes(data)
    with pytest.raises(SampleError) as raised:
        convert(str(src), str(tmp_path / "raise"), options(tokenizer), quiet=True)
    message = str(raised.value)
    assert message.startswith(f"{src / name}: damaged") and reason in message and "lost" in message and "\n" not in message
    for on_error in ("raise", "skip"):
        out = tmp_path / f"cli-{on_error}"
        cli = run_cli("convert", str(src), str(out), "--from", "jsonl", "--tokenizer", str(tokenizer), "--on-error", on_error, "--quiet", check=False)
        if on_error == "raise":
            assert cli.returncode == 2 and len(cli.stderr.strip().splitlines()) == 1 and str(src / name) in cli.stderr, cli.stderr
    index = read_index(out)
    assert cli.returncode == 0 and (0 < index.num_samples < 5000 if kept is None else index.num_samples == kept)
    (entry,) = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert entry["where"] == name and reason in entry["reason"]
    assert f"the documents from line {index.num_samples + 1} on are lost, their number unknown" in entry["reason"]


def test_a_cut_zstd_stream_is_damage_naming_the_file(tokenizer_file: Path, tmp_path: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    data = numbered_documents(5000)
    whole = zstandard.ZstdCompressor(write_checksum=True).compress(data)
    assert_damage_reported(tokenizer_file, tmp_path / "cut", whole[: len(whole) // 3], "d.jsonl.zst", "damaged zstd stream (cut short inside a frame",
                           kept=None)
    assert_damage_reported(tokenizer_file, tmp_path / "header", whole[:3], "d.jsonl.zst", "cut short inside a frame header at byte 0", kept=0)
    assert_damage_reported(tokenizer_file, tmp_path / "after", whole + b"more", "d.jsonl.zst", "damaged zstd stream (", kept=5000)
    (tmp_path / "two").mkdir()
    half = data.index(b"\n", len(data) // 2) + 1  # two frames, and a skippable one between: every document read
    skippable = (0x184D2A53).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    (tmp_path / "two" / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data[:half]) + skippable
                                                   + zstandard.ZstdCompressor().compress(data[half:]))
    assert convert(str(tmp_path / "two"), str(tmp_path / "two-out"), options(tokenizer_file), quiet=True).index.num_samples == 5000


def test_a_damaged_gzip_stream_is_one_line_naming_the_file(tokenizer_file: Path, tmp_path: Path) -> None:
    import gzip

    whole = gzip.compress(numbered_documents(5000), mtime=0)
    assert_damage_reported(tokenizer_file, tmp_path / "cut", whole[: len(whole) // 3], "d.jsonl.gz",
                           "damaged gzip stream (cut short: it ends before its end-of-stream marker)", kept=None)
    bad_block = whole[:10] + b"\xff" + whole[11:]  # the first deflate block of a reserved type
    assert_damage_reported(tokenizer_file, tmp_path / "block", bad_block, "d.jsonl.gz", "damaged gzip stream (corrupt deflate data)", kept=0)
    bad_crc = whole[:-8] + bytes(4) + whole[-4:]
    assert_damage_reported(tokenizer_file, tmp_path / "crc", bad_crc, "d.jsonl.gz", "damaged gzip stream (CRC check failed", kept=5000)
    assert_damage_reported(tokenizer_file, tmp_path / "not", b"PK\x03\x04" + whole, "d.jsonl.gz", "damaged gzip stream (not gzip data)", kept=0)


def test_lines_end_at_newlines_only_in_every_codec(tokenizer_file: Path, tmp_path: Path) -> None:
    """A bare carriage return is JSON whitespace inside a line, in a plain file as in a gzip stream."""
    import gzip

    data = b'{"text": "first"}\n{"text":\r"second, a carriage return before it"}\r\n{"text": "third"}\n'
    for name in ("plain/d.jsonl", "gzip/d.jsonl.gz"):
        (tmp_path / name).parent.mkdir()
        (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
        report = convert(str(tmp_path / name), str(tmp_path / f"{name}.out"), options(tokenizer_file), quiet=True)
        assert report.index.num_samples == 3 and not report.index.skipped


def gzip_with_a_long_line(path: Path, line_bytes: int) -> Path:
    """A .jsonl.gz of a document, one of ``line_bytes`` spaces and a closing quote, and another
    document (compressed a MiB at a time: the long line is never held here either)."""
    import zlib

    packer = zlib.compressobj(1, zlib.DEFLATED, 31)  # gzip framing
    with open(path, "wb") as f:
        f.write(packer.compress(b'{"text": "before"}\n{"text": "'))
        for _ in range(line_bytes >> 20):
            f.write(packer.compress(b" " * (1 << 20)))
        f.write(packer.compress(b'"}\n{"text": "after"}\n') + packer.flush())
    return path


def test_a_line_too_long_is_a_bad_document_read_in_bounded_pieces(tokenizer_file: Path, tmp_path: Path) -> None:
    """A 1 GiB line in a 4.6 MB .jsonl.gz, converted under a 2 GiB address space: the line is
    skipped (or the error) naming the file and line, read past in pieces; it was read whole (a
    MemoryError traceback)."""
    src = gzip_with_a_long_line(tmp_path / "d.jsonl.gz", 1 << 30)
    reason = f"line too long ({(1 << 30) + 13} bytes, more than the 16 MiB a line may hold)"
    warm_up = write_jsonl(tmp_path / "warm-up.jsonl", ["a document"])
    convert_to = PEAK_RSS + f"""
import json
from fastload.converters import ConvertOptions, convert
from fastload.converters.convert_options import TokenizeOptions
from fastload.errors import SampleError
def options(on_error):
    return ConvertOptions(source="jsonl", layout="tokens", on_error=on_error, tokens=TokenizeOptions({str(tokenizer_file)!r}))
convert({str(warm_up)!r}, {str(tmp_path / "warm")!r}, options("raise"), quiet=True)  # what every conversion imports and loads
before = peak_rss()
try:
    convert({str(src)!r}, {str(tmp_path / "raise")!r}, options("raise"), quiet=True)
    raised = None
except SampleError as exc:
    raised = str(exc)
report = convert({str(src)!r}, {str(tmp_path / "skip")!r}, options("skip"), quiet=True)
grown = peak_rss() - before
print(json.dumps({{"raised": raised, "documents": report.index.num_samples, "skipped": report.index.skipped, "grown": grown}}))
"""
    got = run_limited(convert_to, memory_bytes=2 << 30, timeout=300)
    assert got["raised"] == f"{src}:2: {reason}"
    assert got["documents"] == 2 and got["skipped"] == {"line too long": 1}, got
    (entry,) = [json.loads(line) for line in (tmp_path / "skip" / "skipped.jsonl").read_text().splitlines()]
    assert entry["reason"] == reason
    assert got["grown"] < 128 << 20, got  # a line's worth (16 MiB) and its copies


def test_a_plain_file_reads_past_a_line_too_long_in_pieces(tokenizer_file: Path, tmp_path: Path) -> None:
    """The same limit in a plain file, whose chunks are cut at line ends past it."""
    long_line = b'{"text": "' + b" " * (17 << 20) + b'"}\n'
    (tmp_path / "d.jsonl").write_bytes(b'{"text": "before"}\n' + long_line + b'{"text": "after"}\n')
    report = convert(str(tmp_path / "d.jsonl"), str(tmp_path / "out"), options(tokenizer_file, on_error="skip", shard_tokens=600), quiet=True)
    assert report.index.num_samples == 2
    (entry,) = [json.loads(line) for line in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert entry["where"].endswith("d.jsonl: line at byte 19")
    assert entry["reason"] == f"line too long ({len(long_line)} bytes, more than the 16 MiB a line may hold)"


@pytest.mark.parametrize("source,name", [("jsonl", "b.jsonl"), ("jsonl", "b.jsonl.gz"), ("text", "b.txt")])
def test_a_document_linked_from_outside_the_source_is_refused_by_name(tokenizer_file: Path, tmp_path: Path, source: str, name: str) -> None:
    """As the image sources do: a file linked into the source folder from its sibling ``src-private``
    is refused naming the link, unless --follow-symlinks."""
    import gzip

    src = tmp_path / "src"
    src.mkdir()
    for file, text in (("a" + name[1:], "public text"), (name, "private text")):
        data = (json.dumps({"text": text}) + "\n").encode() if source == "jsonl" else text.encode()
        (src / file).write_bytes(gzip.compress(data) if file.endswith(".gz") else data)
    link = link_out(src, name)
    args = ["convert", str(src), str(tmp_path / "refused"), "--from", source, "--tokenizer", str(tokenizer_file), "--quiet"]
    refused = run_cli(*args, check=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"{link}: leads outside the source root" in refused.stderr and "--follow-symlinks" in refused.stderr
    assert not (tmp_path / "refused" / "index.json").exists()
    run_cli(*args[:2], str(tmp_path / "followed"), *args[3:], "--follow-symlinks")
    assert read_index(tmp_path / "followed").num_samples == 2


@pytest.mark.parametrize("config,reason", [(b"[" * 50_000 + b"]" * 50_000, "JSON nested too deeply to read"),
                                           (b'{"eos_token": "<|endoftext|>",', "not JSON (JSONDecodeError)")])
def test_a_tokenizer_config_that_does_not_parse_is_named(tokenizer_file: Path, tmp_path: Path, config: bytes, reason: str) -> None:
    """A folder's tokenizer_config.json (where the bos/eos names come from) that is no JSON to read:
    one line naming it (nested 50,000 deep it was a RecursionError naming nothing; cut short, ignored)."""
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    shutil.copy(tokenizer_file, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_bytes(config)
    write_jsonl(tmp_path / "d.jsonl", ["text"])
    refused = run_cli("convert", str(tmp_path / "d.jsonl"), str(tmp_path / "out"), "--from", "jsonl", "--tokenizer", str(folder), "--append-eos",
                      "--quiet", check=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"{folder / 'tokenizer_config.json'}: {reason}" in refused.stderr


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


def test_a_parquet_text_a_dictionary_repeats_is_decoded_once(tokenizer_file: Path, tmp_path: Path) -> None:
    """A 7,200-row group whose text column is one 64 KiB document in a dictionary (a file of a few
    KB, the group declaring 64 KiB): its rows were batched by that size, so the first document read
    decoded the whole group (450 MiB); now each value its rows use is decoded once."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = pa.DictionaryArray.from_arrays(pa.array([0] * 7200, pa.int32()), pa.array(["word " * ((64 << 10) // 5)]))
    pq.write_table(pa.table({"body": texts}), tmp_path / "d.parquet", compression="zstd")
    assert (tmp_path / "d.parquet").stat().st_size < 100_000
    warm_up = tmp_path / "warm-up.parquet"
    pq.write_table(pa.table({"body": ["a document"]}), warm_up)
    got = run_limited(PEAK_RSS + f"""
import json
from fastload.converters import ConvertOptions, convert
from fastload.converters.convert_options import TokenizeOptions
from fastload.converters.sources import SourceOptions
def options(limit):
    return ConvertOptions(source="parquet", layout="tokens", limit=limit, source_options=SourceOptions(text_field="body"),
                          tokens=TokenizeOptions({str(tokenizer_file)!r}, shard_tokens=10_000_000))
convert({str(warm_up)!r}, {str(tmp_path / "warm")!r}, options(None), quiet=True)
before = peak_rss()
report = convert({str(tmp_path / "d.parquet")!r}, {str(tmp_path / "out")!r}, options(2), quiet=True)
print(json.dumps({{"grown": peak_rss() - before, "documents": report.index.num_samples}}))
""", memory_bytes=3 << 30, timeout=300)
    assert got["documents"] == 2
    assert got["grown"] < 64 << 20, got  # a document of 64 KiB at a time; the whole group was 450 MiB


def test_a_damaged_parquet_file_is_one_line_naming_it(tokenizer_file: Path, tmp_path: Path) -> None:
    """A footer that does not parse, an empty file and a page that does not decompress: pyarrow's
    messages (several lines, naming no file) became one line naming the file; a damaged page of
    documents is a skippable loss naming the row group, the rows before it kept."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    texts = real_paragraphs()[:60]
    whole = tmp_path / "whole.parquet"
    pq.write_table(pa.table({"text": texts}), whole, row_group_size=20, compression="snappy")
    data = whole.read_bytes()
    damaged = {"footer": data[:-8] + (len(data) - 9).to_bytes(4, "little") + b"PAR1", "empty": b""}  # a footer length past the magic
    meta = pq.read_metadata(whole).row_group(1).column(0)
    page = meta.data_page_offset + 24  # inside row group 1's first data page, past its header
    damaged["page"] = data[:page] + bytes(64) + data[page + 64:]
    for name, content in damaged.items():
        src = tmp_path / name
        src.mkdir()
        (src / "docs.parquet").write_bytes(content)
        args = ["convert", str(src), str(tmp_path / f"out-{name}"), "--from", "parquet", "--text-field", "text", "--tokenizer", str(tokenizer_file)]
        raised = run_cli(*args, check=False)
        assert raised.returncode == 2 and len(raised.stderr.strip().splitlines()) == 1, (name, raised.stderr)
        assert str(src / "docs.parquet") in raised.stderr and "Parquet" in raised.stderr, (name, raised.stderr)
        if name == "page":
            skipped = run_cli(*args[:2], str(tmp_path / "out-page-skip"), *args[3:], "--on-error", "skip")
            assert skipped.returncode == 0
            (entry,) = [json.loads(line) for line in (tmp_path / "out-page-skip" / "skipped.jsonl").read_text().splitlines()]
            assert "damaged Parquet data in row group 1" in entry["reason"] and "rows from 0 on are lost" in entry["reason"]
            assert read_index(tmp_path / "out-page-skip").num_samples == 40  # row groups 0 and 2


# Lines a plain chunk's reader (each line parsed at once, by orjson where installed) must take as
# the line-by-line reader of a stream does: good ones, and bad ones with the same reason
HOSTILE_LINES = [line for line, _ in BAD_LINES] + [
    json.dumps({"text": "caf\u00e9 na\u00efve \u4e2d\u6587 \U0001f600"}).encode() + b"\n",  # non-ASCII as \u escapes
    json.dumps({"text": "caf\u00e9 na\u00efve \u4e2d\u6587 \U0001f600"}, ensure_ascii=False).encode() + b"\n",  # ... as UTF-8
    b'{"text": "a lone low \\udc00 surrogate"}\n',
    b'{"text": "a pair \\ud83d\\ude00 and a NUL \\u0000"}\n',
    b'{"text": "first", "text": "the last of duplicate keys"}\n',
    b'{"text": "NaN beside it", "v": NaN}\n',
    b'{"text": "a big number beside it", "n": 123456789012345678901234567890}\n',
    b'{"text": "nested 70 deep beside it", "m": ' + b"[" * 70 + b"]" * 70 + b"}\n",
    b'{"text": "nested 1000 deep beside it", "m": ' + b"[" * 1000 + b"]" * 1000 + b"}\n",  # orjson takes it, json's recursion limit not
    b'{"text": "two objects"}\r{"text": "on one line"}\n',
    b'{"text": "one"} {"text": "two"}\n',
    b'\xef\xbb\xbf{"text": "after a byte order mark"}\n',
    b'{"text": "a raw\ttab"}\n',
    b'{"text": "encoded surrogate \xed\xa0\x80"}\n',
    b'{"text": 12}\n',
    b'{"text": null}\n',
    b"   \n", b"\n", b"\t\r\n",
    b'  {"text": "spaces around it"}  \r\n',
]


def test_a_plain_chunk_read_whole_gives_what_the_line_by_line_reader_gives(tokenizer_file: Path, tmp_path: Path) -> None:
    """The hostile lines between real documents, the last one without its newline: a plain file
    (chunks read whole, each line parsed at once) gives the documents and the skip reasons a gzip
    stream of the same bytes (read line by line) gives, and names each bad line by its byte offset."""
    import gzip

    good = [json.dumps({"text": text}).encode() + b"\n" for text in real_paragraphs()[:20 * len(HOSTILE_LINES)]]
    lines = [line for n, hostile in enumerate(HOSTILE_LINES) for line in (*good[n * 20:(n + 1) * 20], hostile)]
    data = b"".join(lines) + b'{"text": "the last line, with no newline"}'
    (tmp_path / "plain").mkdir()
    (tmp_path / "gz").mkdir()
    (tmp_path / "plain" / "d.jsonl").write_bytes(data)
    (tmp_path / "gz" / "d.jsonl.gz").write_bytes(gzip.compress(data))
    reports, skipped = {}, {}
    for name in ("plain", "gz"):
        reports[name] = convert(str(tmp_path / name), str(tmp_path / f"{name}.out"), options(tokenizer_file, on_error="skip", shard_tokens=10_000),
                                quiet=True)
        skipped[name] = [json.loads(line) for line in (tmp_path / f"{name}.out" / "skipped.jsonl").read_text().splitlines()]
    assert len(reports["plain"].index.shards) >= 3  # several chunks (the gzip stream is one item)
    assert [e["reason"] for e in skipped["plain"]] == [e["reason"] for e in skipped["gz"]]
    assert len(skipped["plain"]) == len(BAD_LINES) + 9
    assert reports["plain"].index.num_samples == len(good) + 1 + len(HOSTILE_LINES) - len(skipped["plain"]) - 3  # 3 blank lines
    assert documents(tmp_path / "plain.out") == documents(tmp_path / "gz.out")
    for entry in skipped["plain"]:
        offset = int(entry["where"].rsplit(" ", 1)[1])
        assert data[offset:].split(b"\n", 1)[0] + b"\n" in HOSTILE_LINES  # the bad line starts at the byte it is named by

"""Documents into token shards through ``fastload convert``: every source, the index's tokenizer
and counts, byte-reproducible output at any worker count, resume, dedupe, verify and inspect."""

from __future__ import annotations

import gzip
import json
import shutil
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fastload.cli.command import main
from fastload.converters import ConvertOptions, convert
from fastload.converters.convert_options import TokenizeOptions
from fastload.formats.index import read_index
from fastload.formats.shard_files import open_shard
from fastload.formats.tokens.reader import TokenShardReader
from fastload.storage.summary import summarize
from fastload.storage.verify import verify_dataset
from fastload.text.tokenizer import TextTokenizer
from tests.conftest import run_cli
from tests.text.conftest import forging_documents, real_paragraphs, write_jsonl


def token_options(tokenizer: Path, source: str = "jsonl", workers: int = 1, text_field: str | None = None, **tokens) -> ConvertOptions:
    from fastload.converters.sources import SourceOptions

    return ConvertOptions(source=source, layout="tokens", workers=workers, source_options=SourceOptions(text_field=text_field),
                          tokens=TokenizeOptions(str(tokenizer), **{"shard_tokens": 40_000, **tokens}))


def documents(root: Path) -> list[list[int]]:
    """Every document's ids, shard by shard, read through the public reader."""
    index = read_index(root)
    out = []
    for shard in index.shards:
        reader = open_shard(root, index, shard)
        assert isinstance(reader, TokenShardReader)
        out += [reader.document(i).tolist() for i in range(len(reader))]
        reader.close()
    return out


def test_jsonl_documents_become_token_shards_sized_by_tokens(corpus: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    report = convert(str(corpus), str(tmp_path / "out"), token_options(tokenizer_file, append_eos=True), quiet=True)
    index = report.index
    texts = real_paragraphs()
    expected = [[*ids, index.tokenizer.eos_id] for ids in TextTokenizer(str(tokenizer_file)).encode(texts)]
    assert documents(tmp_path / "out") == expected  # every document, in source order, each ending in eos
    assert index.version == 5 and index.layout == "tokens" and index.fields == ("tokens",)
    assert index.tokenizer.vocab_size == 2000 and index.tokenizer.dtype == "uint16" and index.tokenizer.eos_id == 0
    assert index.num_samples == len(texts) and index.num_tokens == sum(map(len, expected))
    assert json.loads((tmp_path / "out" / "index.json").read_text())["num_tokens"] == index.num_tokens  # the file says it too
    assert len(index.shards) >= 3 and sum(s.tokens for s in index.shards) == index.num_tokens
    assert all(s.tokens <= 2 * 40_000 for s in index.shards)  # about --shard-tokens each (within a chunk)
    assert all(s.bytes == 2 * s.tokens for s in index.shards)  # uint16 on disk
    assert all(s.path.endswith(".bin") and (tmp_path / "out" / s.table).is_file() for s in index.shards)
    assert verify_dataset(tmp_path / "out").ok
    summary = summarize(tmp_path / "out")["tokens"]
    assert sum(summary["length_histogram"].values()) == len(texts) and summary["top_ids"]


def test_output_is_byte_identical_for_any_worker_count(corpus: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    one = convert(str(corpus), str(tmp_path / "one"), token_options(tokenizer_file, workers=1), quiet=True)
    two = convert(str(corpus), str(tmp_path / "two"), token_options(tokenizer_file, workers=2), quiet=True)
    assert (tmp_path / "one" / "index.json").read_bytes() == (tmp_path / "two" / "index.json").read_bytes()
    for shard in one.index.shards:
        for name in (shard.path, shard.table):
            assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    assert two.shards_written == len(two.index.shards)


@pytest.mark.slow
def test_ray_output_is_byte_identical_to_local(corpus: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    convert(str(corpus), str(tmp_path / "local"), token_options(tokenizer_file, workers=2), quiet=True)
    convert(str(corpus), str(tmp_path / "ray"), token_options(tokenizer_file, workers=2), engine="ray", quiet=True)
    for path in sorted((tmp_path / "local").iterdir()):
        assert path.read_bytes() == (tmp_path / "ray" / path.name).read_bytes(), path.name


def test_compressed_jsonl_streams_give_the_same_tokens(corpus: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    import zstandard

    plain = tmp_path / "plain"
    plain.mkdir()
    shutil.copy(corpus / "a.jsonl", plain / "a.jsonl")
    packed = tmp_path / "packed"
    packed.mkdir()
    data = (corpus / "a.jsonl").read_bytes()
    half = data.index(b"\n", len(data) // 2) + 1
    (packed / "a1.jsonl.gz").write_bytes(gzip.compress(data[:half]))
    (packed / "a2.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data[half:]))
    convert(str(plain), str(tmp_path / "p"), token_options(tokenizer_file), quiet=True)
    convert(str(packed), str(tmp_path / "c"), token_options(tokenizer_file), quiet=True)
    assert documents(tmp_path / "p") == documents(tmp_path / "c")


def test_text_parquet_and_wds_sources_hold_the_same_documents(tokenizer_file: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = real_paragraphs()[:200]
    folder = tmp_path / "txt"
    folder.mkdir()
    for n, text in enumerate(texts):
        (folder / f"doc{n:04d}.txt").write_text(text)
    pq.write_table(pa.table({"content": texts, "n": list(range(len(texts)))}), tmp_path / "docs.parquet", row_group_size=64)
    with tarfile.open(tmp_path / "docs.tar", "w") as tar:
        for n, text in enumerate(texts):
            info = tarfile.TarInfo(f"doc{n:04d}.txt")
            info.size = len(text.encode())
            tar.addfile(info, fileobj=__import__("io").BytesIO(text.encode()))
    write_jsonl(tmp_path / "docs.jsonl", texts, field="body")
    expected = TextTokenizer(str(tokenizer_file)).encode(texts)
    for source, src, field in (("text", folder, None), ("parquet", tmp_path / "docs.parquet", "content"),
                               ("wds", tmp_path / "docs.tar", "txt"), ("jsonl", tmp_path / "docs.jsonl", "body")):
        out = tmp_path / f"out-{source}"
        convert(str(src), str(out), token_options(tokenizer_file, source=source, text_field=field), quiet=True)
        assert documents(out) == expected, source


def test_exact_duplicates_are_dropped_keeping_the_first(tokenizer_file: Path, tmp_path: Path) -> None:
    texts = real_paragraphs()[:300]
    write_jsonl(tmp_path / "a.jsonl", texts + texts[:50])
    write_jsonl(tmp_path / "b.jsonl", texts[100:120])
    options = ConvertOptions(source="jsonl", layout="tokens", dedupe=True, tokens=TokenizeOptions(str(tokenizer_file), shard_tokens=5000))
    report = convert(str(tmp_path), str(tmp_path / "out"), options, quiet=True)
    assert report.index.duplicates == 70 and report.index.num_samples == 300
    assert documents(tmp_path / "out") == TextTokenizer(str(tokenizer_file)).encode(texts)
    lines = [json.loads(line) for line in (tmp_path / "out" / "duplicates.jsonl").read_text().splitlines()]
    assert len(lines) == 70 and lines[0]["duplicate_of_document"] == 0


def test_duplicates_after_a_bad_line_in_the_same_chunk_are_dropped(tokenizer_file: Path, tmp_path: Path) -> None:
    """Duplicates are named by their document's number in the chunk, a bad line counted: those
    after a bad line (read as a second run of texts) are dropped, and only they."""
    texts = real_paragraphs()[:11]
    lines = [json.dumps({"text": text}) for text in texts[:10]] + ['{"text": 12}'] + [json.dumps({"text": text}) for text in (*texts[:2], texts[10])]
    (tmp_path / "a.jsonl").write_text("".join(line + "\n" for line in lines))
    options = ConvertOptions(source="jsonl", layout="tokens", dedupe=True, on_error="skip", tokens=TokenizeOptions(str(tokenizer_file)))
    report = convert(str(tmp_path / "a.jsonl"), str(tmp_path / "out"), options, quiet=True)
    assert report.index.duplicates == 2 and sum(report.index.skipped.values()) == 1
    assert documents(tmp_path / "out") == TextTokenizer(str(tokenizer_file)).encode(texts)


def test_bos_and_min_tokens(corpus: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    texts = ["a b", "a much longer paragraph of several words than the first", "x"]
    write_jsonl(tmp_path / "a.jsonl", texts)
    report = convert(str(tmp_path / "a.jsonl"), str(tmp_path / "out"),
                     token_options(tokenizer_file, bos=True, bos_token="<|pad|>", append_eos=True, min_tokens=5), quiet=True)
    (kept,) = documents(tmp_path / "out")
    assert kept[0] == 1 and kept[-1] == 0 and kept[1:-1] == TextTokenizer(str(tokenizer_file)).encode([texts[1]])[0]
    assert report.index.skipped == {"fewer than 5 tokens": 2}


def test_an_interrupted_conversion_resumes_and_rewrites_only_what_changed(tokenizer_file: Path, tmp_path: Path) -> None:
    texts = real_paragraphs()[:1200]
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "a.jsonl", texts[:600])
    good_b = write_jsonl(src / "b.jsonl", texts[600:]).read_bytes()
    (src / "b.jsonl").write_bytes(good_b + b'{"text": 3}\n')  # a bad last document stops the first run
    options = token_options(tokenizer_file, shard_tokens=10_000)
    with pytest.raises(Exception, match=r"b.jsonl: line at byte \d+: field 'text' is a int, not a string"):
        convert(str(src), str(tmp_path / "out"), options, quiet=True)
    (src / "b.jsonl").write_bytes(good_b)
    report = convert(str(src), str(tmp_path / "out"), options, quiet=True)
    assert report.shards_reused >= 1 and report.shards_written >= 1
    convert(str(src), str(tmp_path / "clean"), options, quiet=True)
    assert (tmp_path / "out" / "index.json").read_bytes() == (tmp_path / "clean" / "index.json").read_bytes()


def test_the_command_converts_verifies_and_inspects(corpus: Path, tokenizer_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["convert", str(corpus), str(out), "--from", "jsonl", "--tokenizer", str(tokenizer_file), "--append-eos",
                 "--shard-tokens", "50K", "--workers", "2", "--quiet"]) == 0
    assert "token shards" in capsys.readouterr().out
    assert main(["verify", str(out)]) == 0
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "tokens" in shown and "uint16" in shown and "'<|endoftext|>'" in shown and "64-127" in shown
    data = np.fromfile(out / "shard-00000.bin", dtype="<u2")  # a plain .bin: numpy reads it as nanoGPT does
    assert data.size == read_index(out).shards[0].tokens


def test_limit_converts_the_first_documents_and_shuffle_is_refused(tokenizer_file: Path, tmp_path: Path) -> None:
    """--limit N means the first N documents (a token conversion's samples), across files and the
    chunks of a plain file; --shuffle, which orders samples before sharding, is refused by name."""
    texts = [f"{n}: {text}" for n, text in enumerate(real_paragraphs()[:400])]
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "a.jsonl", texts[:150])
    (src / "b.jsonl.gz").write_bytes(gzip.compress(write_jsonl(tmp_path / "b.jsonl", texts[150:]).read_bytes()))
    tokenizer = TextTokenizer(str(tokenizer_file))
    for limit in (10, 150, 170, 400, 1000):
        out = tmp_path / f"limit-{limit}"
        run_cli("convert", str(src), str(out), "--from", "jsonl", "--tokenizer", str(tokenizer_file), "--limit", str(limit),
                "--shard-tokens", "5000", "--dedupe", "--quiet")
        assert documents(out) == tokenizer.encode(texts[:limit])
    shuffled = run_cli("convert", str(src), str(tmp_path / "shuffled"), "--from", "jsonl", "--tokenizer", str(tokenizer_file), "--shuffle", check=False)
    assert shuffled.returncode == 2 and len(shuffled.stderr.strip().splitlines()) == 1 and "--shuffle" in shuffled.stderr
    assert "source order" in shuffled.stderr and not (tmp_path / "shuffled").exists()


def test_the_summary_counts_the_shards_written_in_words_that_agree(tokenizer_file: Path, tmp_path: Path) -> None:
    """No document kept is no shard written (it said "1 shards written"); one is one shard."""
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "d.jsonl").write_bytes(b'{"text": ""}\n{"body": "no text"}\n')
    report = convert(str(tmp_path / "bad"), str(tmp_path / "none"), replace(token_options(tokenizer_file), on_error="skip"), quiet=True)
    assert report.shards_written == 0 and report.index.shards == ()
    args = ["--from", "jsonl", "--tokenizer", str(tokenizer_file), "--on-error", "skip"]
    none = run_cli("convert", str(tmp_path / "bad"), str(tmp_path / "cli-none"), *args).stdout
    assert ": 0 documents, 0 tokens (uint16) in 0 token shards in " in none and "; 0 shards written, 0 resumed" in none
    assert "skipped 2 bad samples" in none
    write_jsonl(tmp_path / "one.jsonl", ["a single document"])
    one = run_cli("convert", str(tmp_path / "one.jsonl"), str(tmp_path / "cli-one"), *args).stdout
    tokens = len(TextTokenizer(str(tokenizer_file)).encode(["a single document"])[0])
    assert f": 1 document, {tokens} tokens (uint16) in 1 token shard in " in one and "; 1 shard written, 0 resumed" in one


def test_min_tokens_keeps_a_document_of_exactly_that_many(tokenizer_file: Path, tmp_path: Path) -> None:
    texts = real_paragraphs()[:40]
    lengths = [len(ids) for ids in TextTokenizer(str(tokenizer_file)).encode(texts)]
    n = sorted(lengths)[len(lengths) // 2]  # a length some documents have, some have fewer and some more
    write_jsonl(tmp_path / "a.jsonl", texts)
    report = convert(str(tmp_path / "a.jsonl"), str(tmp_path / "out"), token_options(tokenizer_file, min_tokens=n), quiet=True)
    kept = [len(ids) for ids in documents(tmp_path / "out")]
    assert n in kept and kept == [length for length in lengths if length >= n]
    assert report.index.skipped == {f"fewer than {n} tokens": sum(length < n for length in lengths)}


def test_exact_dedupe_tells_apart_documents_sharing_a_long_prefix(tokenizer_file: Path, tmp_path: Path) -> None:
    """Files that open with the same licence header and differ after it are different documents."""
    paragraphs = real_paragraphs()
    header = "\n\n".join(paragraphs[:20])  # several thousand characters of licence text
    assert len(header) > 4000
    texts = [f"{header}\n\n{body}" for body in paragraphs[100:106]]
    write_jsonl(tmp_path / "a.jsonl", [*texts, texts[2]])
    options = ConvertOptions(source="jsonl", layout="tokens", dedupe=True, tokens=TokenizeOptions(str(tokenizer_file), shard_tokens=50_000))
    report = convert(str(tmp_path / "a.jsonl"), str(tmp_path / "out"), options, quiet=True)
    assert report.index.duplicates == 1 and report.index.num_samples == len(texts)
    assert documents(tmp_path / "out") == TextTokenizer(str(tokenizer_file)).encode(texts)


def test_bos_and_eos_tokens_given_override_a_tokenizer_folders_config(tokenizer_file: Path, tmp_path: Path) -> None:
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    shutil.copy(tokenizer_file, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|endoftext|>", "eos_token": {"content": "<|endoftext|>"}}))
    write_jsonl(tmp_path / "a.jsonl", ["a short document", "and another one"])
    common = ["convert", str(tmp_path / "a.jsonl"), "--from", "jsonl", "--tokenizer", str(folder), "--bos", "--append-eos", "--quiet"]
    assert main([*common[:2], str(tmp_path / "configured"), *common[2:]]) == 0
    assert main([*common[:2], str(tmp_path / "given"), *common[2:], "--bos-token", "<|pad|>", "--eos-token", "<|pad|>"]) == 0
    configured, given = read_index(tmp_path / "configured").tokenizer, read_index(tmp_path / "given").tokenizer
    assert (configured.bos_id, configured.eos_id) == (0, 0)  # the config's <|endoftext|>
    assert (given.bos_id, given.eos_id) == (1, 1)  # <|pad|>, as given
    assert all(ids[0] == 1 and ids[-1] == 1 for ids in documents(tmp_path / "given"))


def without_special_tokens(tokenizer_file: Path):
    """An independent reference for "ordinary text": the tokenizer.json with its special added
    tokens removed, so nothing in it can match them."""
    from tokenizers import Tokenizer

    data = json.loads(tokenizer_file.read_text())
    data["added_tokens"] = [token for token in data["added_tokens"] if not token["special"]]
    return Tokenizer.from_str(json.dumps(data))


@pytest.mark.parametrize("encoder", ["tokenizers", "fast"])
def test_a_document_cannot_forge_a_boundary_unless_special_tokens_are_allowed(tokenizer_file: Path, tmp_path: Path, encoder: str) -> None:
    from tokenizers import Tokenizer

    if encoder == "fast":
        pytest.importorskip("fastokens")
    texts = forging_documents()
    write_jsonl(tmp_path / "a.jsonl", texts)
    specials = {0, 1}  # <|endoftext|>, <|pad|>
    for allow in (False, True):
        out = tmp_path / f"out-{allow}"
        assert main(["convert", str(tmp_path / "a.jsonl"), str(out), "--from", "jsonl", "--tokenizer", str(tokenizer_file),
                     "--quiet", "--encoder", encoder, *(["--allow-special-tokens"] if allow else [])]) == 0
        ids, tokenizer = documents(out), read_index(out).tokenizer
        assert tokenizer.eos_id == 0 and tokenizer.special == {"<|endoftext|>": 0, "<|pad|>": 1}
        reference = Tokenizer.from_file(str(tokenizer_file)) if allow else without_special_tokens(tokenizer_file)
        assert ids == [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
        if allow:  # today's call: the text of a special token gets its id
            assert ids[0] == [0] and ids[5] == [0, 0] and sum(0 in doc for doc in ids) > 250
        else:
            assert not any(specials & set(doc) for doc in ids)
        assert tokenizer.special_text == ("special" if allow else "ordinary")
        assert tokenizer.encoder.startswith("fastokens " if encoder == "fast" else "tokenizers ")
    assert documents(tmp_path / "out-False") != documents(tmp_path / "out-True")


def test_an_index_written_before_the_encoding_was_recorded_still_reads(corpus: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    convert(str(corpus / "a.jsonl"), str(tmp_path / "out"), token_options(tokenizer_file, encoder="tokenizers"), quiet=True)
    data = json.loads((tmp_path / "out" / "index.json").read_text())
    assert data["tokenizer"]["special_text"] == "ordinary" and data["tokenizer"]["encoder"].startswith("tokenizers ")
    del data["tokenizer"]["special_text"], data["tokenizer"]["encoder"]
    (tmp_path / "out" / "index.json").write_text(json.dumps(data))
    older = read_index(tmp_path / "out")
    assert older.tokenizer.special_text is None and older.tokenizer.encoder is None
    assert documents(tmp_path / "out") == TextTokenizer(str(tokenizer_file)).encode(real_paragraphs()[: len(real_paragraphs()) // 2])


def transformers_folder(tokenizer_file: Path, folder: Path) -> Path:
    """The fixture's BPE as a transformers GPT-2 folder without a tokenizer.json (vocab.json, merges.txt)."""
    data = json.loads(tokenizer_file.read_text())
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps(data["model"]["vocab"]))
    merges = ("".join(f"{' '.join(m) if isinstance(m, list) else m}\n" for m in data["model"]["merges"]))
    (folder / "merges.txt").write_text("#version: 0.2\n" + merges)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
        "pad_token": "<|pad|>", "add_prefix_space": False}))
    return folder


def test_a_transformers_folder_forges_no_boundary_either(tokenizer_file: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    folder = transformers_folder(tokenizer_file, tmp_path / "gpt2")
    texts = forging_documents()[:60]
    write_jsonl(tmp_path / "a.jsonl", texts)
    for allow in (False, True):
        out = tmp_path / f"out-{allow}"
        assert main(["convert", str(tmp_path / "a.jsonl"), str(out), "--from", "jsonl", "--tokenizer", str(folder), "--quiet",
                     *(["--allow-special-tokens"] if allow else [])]) == 0
        reference = Tokenizer.from_file(str(tokenizer_file)) if allow else without_special_tokens(tokenizer_file)
        assert documents(out) == [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
        tokenizer = read_index(out).tokenizer
        assert tokenizer.kind == "transformers" and tokenizer.encoder.startswith("transformers ")
        assert tokenizer.special_text == ("special" if allow else "ordinary")

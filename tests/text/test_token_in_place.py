"""A column of token ids read in place (#40): Parquet files (and ``datasets.save_to_disk`` Arrow, Lance)
whose ``input_ids`` hold the documents the token converter wrote to token shards give, through
``fastload.DataLoader(location, seq_len=...)``, the shards' very batches in every packing mode and format,
with workers, resumed exactly and at another world size, ``describe`` naming each segment's file and
row; bad ids are one line naming the row."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload.converters import ConvertOptions, convert
from fastload.converters.convert_options import TokenizeOptions
from fastload.errors import ShardError
from tests.text.conftest import paragraph_shards, real_paragraphs, write_jsonl

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytestmark = pytest.mark.timeout(240)

SEQ = 128
BLOCK = 4096
SPLIT = 500  # the first file's rows


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def shards(tokenizer_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real paragraphs (with eos) converted to token shards of about 20,000 tokens."""
    return paragraph_shards(tmp_path_factory.mktemp("tokens"), tokenizer_file, 1200, 20_000)


def documents(path: Path) -> list[list[int]]:
    """Every document's ids of a token dataset, in the dataset's order."""
    ds = fastload.open(path)
    return [ds.reader(shard).document(d).tolist() for shard in range(len(ds.index.shards)) for d in range(len(ds.reader(shard)))]


def write_parquet(folder: Path, docs: list[list[int]], ids: object = None) -> Path:
    """``docs`` as two Parquet files of row groups of 97 rows: ``input_ids`` (list<int32>) beside a text and a number column."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in (("a.parquet", slice(0, SPLIT)), ("b.parquet", slice(SPLIT, None))):
        rows = docs[part]
        table = pa.table({"id": list(range(len(rows))), "input_ids": pa.array(rows, type=ids or pa.list_(pa.int32())),
                          "note": [f"row {n}" for n in range(len(rows))]})
        pq.write_table(table, str(folder / name), row_group_size=97)
    return folder


@pytest.fixture(scope="module")
def parquet(shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shards' documents as Parquet rows."""
    return write_parquet(tmp_path_factory.mktemp("parquet") / "data", documents(shards))


def loader(location: object, **kwargs: object) -> fastload.DataLoader:
    return fastload.DataLoader(str(location), **{"batch_size": 4, "seq_len": SEQ, "block_tokens": BLOCK, "seed": 3, **kwargs})


def same_batches(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


@pytest.mark.parametrize(("packing", "num_workers", "batch_format"), [("concat", 0, "next-token"), ("best-fit", 0, "next-token"),
                                                                       ("pad", 0, "next-token"), ("best-fit", 2, "next-token"),
                                                                       ("concat", 2, "transformers")])
def test_an_input_ids_column_gives_the_token_shards_very_batches(parquet: Path, shards: Path, tokenizer_file: Path, packing: str,
                                                                 num_workers: int, batch_format: str) -> None:
    kwargs = {"packing": packing, "batch_format": batch_format, "packing_window": 2 * BLOCK}
    with loader(parquet, tokenizer=tokenizer_file, num_workers=num_workers, **kwargs) as in_place, loader(shards, **kwargs) as converted:
        assert len(in_place) == len(converted)
        assert same_batches(list(in_place), list(converted))
        assert same_batches(list(in_place), list(converted))  # the next epoch too: another order, the same
        assert in_place.kind.pad_id == converted.kind.pad_id != 0


def test_without_a_tokenizer_rows_pad_with_0_and_hold_the_same_tokens(parquet: Path, shards: Path) -> None:
    for mine, theirs in zip(loader(parquet, packing="best-fit"), loader(shards, packing="best-fit"), strict=True):
        real = theirs["attention_mask"].bool()
        assert torch.equal(mine["attention_mask"], theirs["attention_mask"]) and torch.equal(mine["labels"], theirs["labels"])
        assert torch.equal(mine["input_ids"][real], theirs["input_ids"][real]) and (mine["input_ids"][~real] == 0).all()


def row_ids(parquet: Path, name: str, row: int) -> list[int]:
    return pq.read_table(parquet / name, columns=["input_ids"])["input_ids"][row].as_py()


def test_describe_names_each_segments_file_and_row(parquet: Path) -> None:
    ld = loader(parquet, packing="best-fit")
    for step, batch in zip(range(6), ld):
        for r, row in enumerate(ld.describe(step)):
            column = 0
            for s in row:
                ids = row_ids(parquet, s["shard"], s["document"])
                assert batch["input_ids"][r, column : column + s["tokens"]].tolist() == ids[s["offset"] : s["offset"] + s["tokens"]]
                assert batch["position_ids"][r, column : column + s["tokens"]].tolist() == list(range(s["tokens"]))
                after = ids[s["offset"] + 1 : s["offset"] + s["tokens"] + 1]
                assert batch["labels"][r, column : column + s["tokens"]].tolist() == after + [-100] * (s["tokens"] - len(after))
                column += s["tokens"]
    assert {s["shard"] for step in range(len(ld)) for row in ld.describe(step) for s in row} == {"a.parquet", "b.parquet"}


@pytest.mark.parametrize("packing", ["concat", "best-fit", "pad"])
def test_a_resume_mid_epoch_continues_exactly(parquet: Path, packing: str) -> None:
    whole = list(loader(parquet, packing=packing, packing_window=2 * BLOCK))
    first = loader(parquet, packing=packing, packing_window=2 * BLOCK, num_workers=2)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = loader(parquet, packing=packing, packing_window=2 * BLOCK)
    resumed.load_state_dict(state)
    assert same_batches(list(resumed), whole[5:])


@pytest.mark.parametrize("packing", ["concat", "best-fit", "pad"])
def test_a_resume_at_another_seq_len_and_world_size_gives_the_token_shards_batches(parquet: Path, shards: Path, tokenizer_file: Path,
                                                                                  packing: str) -> None:
    def run(location: Path, **extra: object) -> list[dict]:
        first = loader(location, packing=packing, seq_len=64, packing_window=BLOCK, **extra)
        delivered = list(itertools.islice(first, 5))
        state = json.loads(json.dumps(first.state_dict()))
        for rank in (0, 1):
            resumed = loader(location, packing=packing, seq_len=96, packing_window=BLOCK, rank=rank, world_size=2, **extra)
            resumed.load_state_dict(state)
            delivered += list(resumed)
        return delivered

    assert same_batches(run(parquet, tokenizer=tokenizer_file), run(shards))


def every_token(parquet: Path) -> Counter:
    out: Counter = Counter()
    for name in ("a.parquet", "b.parquet"):
        for row, ids in enumerate(pq.read_table(parquet / name, columns=["input_ids"])["input_ids"].to_pylist()):
            out.update((name, row, i) for i in range(len(ids)))
    return out


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_a_resume_at_another_world_and_batch_size_reads_every_token_once(parquet: Path, packing: str) -> None:
    first = loader(parquet, packing=packing, packing_window=2 * BLOCK, batch_size=4)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    seen: Counter = Counter()
    for rank in (0, 1):
        view = loader(parquet, packing=packing, packing_window=2 * BLOCK, batch_size=6, rank=rank, world_size=2)
        view.load_state_dict(state)
        steps = len(list(view)) + 5
        for step in range(steps):  # the 5 steps before the resume at their topology (rank 1 had none)
            seen.update((s["shard"], s["document"], s["offset"] + i) for row in view.describe(step, 0) for s in row for i in range(s["tokens"]))
    assert seen == every_token(parquet)


def test_the_batch_sampler_makes_the_loaders_batches_from_the_dataset(parquet: Path) -> None:
    one = loader(parquet, packing="best-fit", rank=1, world_size=2)
    parts = torch.utils.data.DataLoader(one.dataset, batch_sampler=one.batch_sampler, collate_fn=one.collate_fn)
    assert same_batches(list(parts), list(one))


@pytest.mark.parametrize("kind", ["arrow", "lance"])
def test_save_to_disk_and_lance_give_the_parquet_files_batches(parquet: Path, tmp_path_factory: pytest.TempPathFactory, kind: str) -> None:
    table = pa.concat_tables([pq.read_table(parquet / name) for name in ("a.parquet", "b.parquet")])
    if kind == "arrow":
        datasets = pytest.importorskip("datasets")
        location = tmp_path_factory.mktemp("saved") / "ds"
        datasets.Dataset(table).save_to_disk(str(location), num_shards=2)
    else:  # written here, as a user would: pylance ran in the process that forks the workers
        lance = pytest.importorskip("lance")
        location = tmp_path_factory.mktemp("lance") / "ds.lance"
        lance.write_dataset(table, str(location), max_rows_per_file=300)
    with loader(location, packing="best-fit", num_workers=2) as ld:
        assert same_batches(list(ld), list(loader(parquet, packing="best-fit")))
        files = {s["shard"] for step in range(len(ld)) for row in ld.describe(step) for s in row}
        assert files == ({"data-00000-of-00002.arrow", "data-00001-of-00002.arrow"} if kind == "arrow" else {"ds.lance"})


def test_a_file_changed_since_its_table_was_made_is_counted_again(shards: Path, tmp_path: Path) -> None:
    docs = documents(shards)
    folder = write_parquet(tmp_path / "data", docs)
    before = list(loader(folder, packing="concat"))
    write_parquet(folder, docs[::-1])  # the same documents, the other way round: other sizes, mtimes and footers
    after = list(loader(folder, packing="concat"))
    write_parquet(tmp_path / "reversed", docs[::-1])
    assert same_batches(after, list(loader(tmp_path / "reversed", packing="concat"))) and not same_batches(before, after)


def test_bad_columns_and_ids_are_one_line_naming_them(parquet: Path, shards: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("no column 'tokens' of token ids (its columns: id, input_ids, note)")):
        loader(parquet, fields=["tokens"])
    with pytest.raises(ValueError, match=re.escape("column 'note' holds text: name the tokenizer that encodes it with tokenizer=")):
        loader(parquet, fields=["note"])
    with pytest.raises(ValueError, match=re.escape("column 'id' holds label, not lists of token ids nor text")):
        loader(parquet, fields=["id"])
    with pytest.raises(ValueError, match=re.escape("fields= names the one column holding each row's token ids (or text)")):
        loader(parquet, fields=["input_ids", "note"])
    with pytest.raises(ValueError, match="fields=, tokenizer= name the column .* holds token shards"):
        loader(shards, fields=["input_ids"], tokenizer=tokenizer_file)
    docs = documents(shards)
    docs[SPLIT + 123][5] = -7
    with pytest.raises(ShardError, match=re.escape("b.parquet:row123: column 'input_ids' holds token id -7, below 0")) as error:
        loader(write_parquet(tmp_path / "negative", docs))
    assert "\n" not in str(error.value)
    docs[SPLIT + 123][5] = 2000  # the tokenizer's vocabulary is 2,000
    folder = write_parquet(tmp_path / "past", docs)
    list(loader(folder))  # no tokenizer named: any id from 0
    with pytest.raises(ShardError, match=re.escape("b.parquet:row123: column 'input_ids' holds token id 2000 at or beyond the tokenizer's vocabulary of 2000")):
        loader(folder, tokenizer=tokenizer_file)
    floats = tmp_path / "floats"
    write_parquet(floats, [[float(i) for i in doc[:3]] for doc in docs], ids=pa.list_(pa.float32()))
    with pytest.raises(ShardError, match=re.escape("column 'input_ids' holds list<element: float>, not lists of token ids")):
        loader(floats)


def test_the_document_table_is_made_once_and_mapped_by_every_loader(parquet: Path, cache: Path) -> None:
    loader(parquet)
    tables = sorted((cache / "in-place").glob("*.docs"))
    assert len(tables) == 1
    made = tables[0].stat().st_mtime_ns
    loader(parquet, packing="pad", num_workers=1)
    assert sorted((cache / "in-place").glob("*.docs")) == tables and tables[0].stat().st_mtime_ns == made
    offsets = np.frombuffer(tables[0].read_bytes()[64:], dtype="<u8")
    rows = sum(pq.read_metadata(parquet / name).num_rows for name in ("a.parquet", "b.parquet"))
    assert len(offsets) == rows + 1 and offsets[-1] == sum(every_token(parquet).values()) and os.path.getsize(tables[0]) == 64 + 8 * (rows + 1)


@pytest.fixture(scope="module")
def texts(tokenizer_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Real paragraphs as a text column of Parquet files, and converted to token shards with the same tokenizer."""
    root = tmp_path_factory.mktemp("texts")
    paragraphs = real_paragraphs()[:700]
    write_jsonl(root / "docs.jsonl", paragraphs)
    convert(str(root / "docs.jsonl"), str(root / "shards"), ConvertOptions(
        source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer_file), shard_tokens=20_000)), quiet=True)
    (root / "parquet").mkdir()
    for name, part in (("a.parquet", slice(0, 300)), ("b.parquet", slice(300, None))):
        pq.write_table(pa.table({"text": paragraphs[part], "n": list(range(len(paragraphs[part])))}), str(root / "parquet" / name),
                       row_group_size=61)
    return root / "parquet", root / "shards"


@pytest.mark.parametrize(("packing", "num_workers"), [("concat", 0), ("best-fit", 2), ("pad", 0)])
def test_a_text_column_encoded_in_the_workers_gives_the_token_shards_batches(texts: tuple[Path, Path], tokenizer_file: Path, packing: str,
                                                                             num_workers: int) -> None:
    parquet, shards = texts
    with loader(parquet, fields=["text"], tokenizer=tokenizer_file, packing=packing, packing_window=2 * BLOCK, num_workers=num_workers) as ld:
        assert same_batches(list(ld), list(loader(shards, packing=packing, packing_window=2 * BLOCK)))
        segment = ld.describe(3)[1][0]
        assert segment["shard"] in ("a.parquet", "b.parquet") and segment["tokens"] > 0


def test_a_text_column_resumes_exactly(texts: tuple[Path, Path], tokenizer_file: Path) -> None:
    parquet, _ = texts
    whole = list(loader(parquet, fields=["text"], tokenizer=tokenizer_file, packing="best-fit"))
    first = loader(parquet, fields=["text"], tokenizer=tokenizer_file, packing="best-fit", num_workers=2)
    it = iter(first)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = loader(parquet, fields=["text"], tokenizer=tokenizer_file, packing="best-fit")
    resumed.load_state_dict(state)
    assert same_batches(list(resumed), whole[7:])


def test_parquet_over_http_gives_the_local_files_batches_read_by_ranges(parquet: Path, tmp_path: Path) -> None:
    from tests.formats.test_parquet_in_place import RangeServer

    server = RangeServer(parquet)
    try:
        remote = fastload.open([f"{server.url}/{name}" for name in ("a.parquet", "b.parquet")], cache_dir=tmp_path / "remote-cache")
        with fastload.DataLoader(remote, batch_size=4, seq_len=SEQ, block_tokens=BLOCK, seed=3, packing="best-fit", num_workers=2) as ld:
            got = list(ld)
    finally:
        server.shutdown()
        server.server_close()
    assert same_batches(got, list(loader(parquet, packing="best-fit")))
    gets = [asked for name, asked in server.gets if name.endswith(".parquet")]
    assert gets and all(asked is not None for asked in gets)  # ranges only, never a whole file
    assert list((tmp_path / "remote-cache" / "in-place").glob("*.docs"))


UNGUARDED = """
import fastload
loader = fastload.DataLoader({location!r}, batch_size=4, seq_len=64)   # no `if __name__ == "__main__":` around it
print(sum(int(batch["attention_mask"].sum()) for batch in loader))
"""


@pytest.mark.timeout(180)
def test_a_script_without_a_main_guard_makes_the_table_and_loads(parquet: Path, tmp_path: Path) -> None:
    """The table is made in a fresh interpreter that does not run the user's script again (multiprocessing's
    spawn did: there the loader was made again and waited for the table's lock its parent held, for ever)."""
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED.format(location=str(parquet)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(fastload.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) == sum(every_token(parquet).values())
    assert done.stderr.count("counted the token ids of column 'input_ids'") == 1


def test_an_id_rewritten_under_the_same_size_and_mtime_is_refused_as_it_is_read(shards: Path, tmp_path: Path) -> None:
    """Ids are checked as they are read, not only when the document table is made: a file rewritten in place
    (plain encoding, no statistics: the same size and footer), its mtime put back, keeps its table."""
    docs = documents(shards)[:300]
    path = tmp_path / "data" / "a.parquet"
    path.parent.mkdir()

    def write(rows: list[list[int]]) -> None:
        pq.write_table(pa.table({"input_ids": pa.array(rows, type=pa.list_(pa.int32()))}), str(path), row_group_size=97,
                       compression="none", use_dictionary=False, write_statistics=False)

    write(docs)
    list(loader(path.parent))
    before = path.stat()
    docs[123][4] = -7
    write(docs)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size
    with pytest.raises(ShardError, match=re.escape("a.parquet:row123: column 'input_ids' holds token id -7, below 0")):
        list(loader(path.parent, num_workers=1))  # a worker: this process keeps the batches it decoded before
    assert len(list((tmp_path / "cache" / "in-place").glob("*.docs"))) == 1  # the same table: counted once


def test_fastload_describe_lists_a_columns_token_rows_as_the_loader_does(texts: tuple[Path, Path], tokenizer_file: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from fastload.cli.command import main

    parquet, _ = texts
    ld = loader(parquet, packing="best-fit", fields=["text"], tokenizer=tokenizer_file)
    common = [str(parquet), "--seq-len", str(SEQ), "--packing", "best-fit", "--block-tokens", str(BLOCK), "--seed", "3", "--batch-size", "4",
              "--field", "text", "--tokenizer", str(tokenizer_file), "--step", "2"]
    assert main(["describe", *common, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == ld.describe(2)
    assert main(["describe", *common]) == 0
    first = ld.describe(2)[0][0]
    assert capsys.readouterr().out.splitlines()[2].startswith(f"    0 {first['shard']}:{first['document']}[{first['offset']}:")
    assert main(["describe", str(parquet), "--step", "0", "--field", "text"]) == 2
    assert "--field: options of a token dataset's rows" in capsys.readouterr().err


def text_column_and_shards(root: Path, tokenizer: Path, texts: list[str]) -> tuple[Path, Path]:
    """``texts`` as the text column of two Parquet files (row groups of 61), and converted to token shards by ``tokenizers``."""
    write_jsonl(root / "docs.jsonl", texts)
    convert(str(root / "docs.jsonl"), str(root / "shards"), ConvertOptions(
        source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer), shard_tokens=20_000, encoder="tokenizers")), quiet=True)
    (root / "parquet").mkdir()
    for name, part in (("a.parquet", slice(0, 150)), ("b.parquet", slice(150, None))):
        pq.write_table(pa.table({"text": texts[part]}), str(root / "parquet" / name), row_group_size=61)
    return root / "parquet", root / "shards"


def encoder_cases() -> dict[str, tuple[object, str | None]]:
    """Tokenizer families fastokens encodes as tokenizers does (no reason), and two it cannot or does not (the reason logged)."""
    from tests.text.test_fast_encoder import FALLBACKS, FAMILIES

    cases: dict[str, tuple[object, str | None]] = {name: (make, None) for name, (make, _) in FAMILIES.items()}
    cases["nfkc"] = (lambda tmp, path: FALLBACKS["nfkc"][0](json.loads(path.read_text())), FALLBACKS["nfkc"][1])
    cases["added-tokens-with-gaps"] = (lambda tmp, path: FALLBACKS["added-tokens-with-gaps"][0](json.loads(path.read_text())),
                                       "b.parquet:row3: fastokens' ids differ from tokenizers'")
    return cases


@pytest.mark.parametrize("case", ["gpt2-byte-level", "llama3-regex", "byte-fallback", "nfkc", "added-tokens-with-gaps"])
def test_a_text_column_is_encoded_by_fastokens_where_it_gave_every_row_tokenizers_ids(tokenizer_file: Path, tmp_path: Path, cache: Path,
                                                                                   case: str, caplog: pytest.LogCaptureFixture) -> None:
    """The document table's pass encodes every row by tokenizers and fastokens and keeps the verdict beside the table
    (``.encoder``): the workers encode with fastokens only where every row's ids were the same, else with tokenizers,
    logging why (a row named); either way the batches are those of the texts converted by tokenizers."""
    pytest.importorskip("fastokens")
    import logging

    from fastload.text.fast_encoder import version

    make, why = encoder_cases()[case]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(make(tmp_path, tokenizer_file)))  # type: ignore[operator]
    texts = real_paragraphs()[:300]
    texts[153] = "fastload's <|im_start|>user\nhi<|im_end|> ﬁne ligatures ① and ＡＢＣ full width"  # b.parquet's row 3
    parquet, shards = text_column_and_shards(tmp_path, path, texts)
    with caplog.at_level(logging.WARNING, logger="fastload"):
        in_place = loader(parquet, fields=["text"], tokenizer=path, packing="best-fit", packing_window=2 * BLOCK, num_workers=2)
    verdict = json.loads(next((cache / "in-place").glob("*.encoder")).read_text())
    assert verdict == ({"fast": version(), "why": None} if why is None else {"fast": None, "why": verdict["why"]})
    if why is not None:
        assert verdict["why"].endswith(why)
        assert [r.getMessage() for r in caplog.records if "not fastokens" in r.getMessage()] == [
            f"{parquet}: column 'text' is encoded by tokenizers, one text at a time, not fastokens ({verdict['why']})"]
    with in_place:
        assert same_batches(list(in_place), list(loader(shards, packing="best-fit", packing_window=2 * BLOCK)))


FORKS_AFTER_ENCODING = """
import json, os, sys, threading, torch, fastload
location, tokenizer = sys.argv[1:]
ld = fastload.DataLoader(location, batch_size=4, seq_len=128, block_tokens=4096, seed=3, fields=["text"], tokenizer=tokenizer)
mine = [ld.batch_sampler.__iter__().__next__().fill(ld.dataset)]   # encoded in this process first
parts = torch.utils.data.DataLoader(ld.dataset, batch_sampler=ld.batch_sampler, collate_fn=ld.collate_fn, num_workers=2)
same = all(all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(parts, ld, strict=True))   # workers forked after it
print(json.dumps([same, os.environ.get("FASTOKENS_BPE_THREADS")]))
"""


def test_a_process_that_encoded_a_text_column_forks_workers_that_encode_it_too(texts: tuple[Path, Path], tokenizer_file: Path,
                                                                               tmp_path: Path) -> None:
    """fastokens encodes a text column in the calling thread alone (FASTOKENS_BPE_THREADS 1 unless set): a process
    that encoded batches itself forks torch's workers, which fill the rest from what it kept, as the loader does."""
    pytest.importorskip("fastokens")
    parquet, _ = texts
    env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(fastload.__file__).parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", FORKS_AFTER_ENCODING, str(parquet), str(tokenizer_file)], capture_output=True, text=True,
                          env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [True, "1"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_batch_sampler_keeps_its_rows_once_a_process_and_gives_the_loaders_batches_across_a_resume(
        texts: tuple[Path, Path], tokenizer_file: Path, num_workers: int) -> None:
    """torch's DataLoader over the loader's parts fills every batch from rows made once a process and dataset (kept
    on the dataset by the loader's settings): the batches of a loader resumed over the same dataset object, at the
    same seq_len and at another, are those the loader itself gives."""
    parquet, _ = texts
    ds = fastload.open(str(parquet))
    text = {"fields": ["text"], "tokenizer": tokenizer_file, "packing": "best-fit", "packing_window": 2 * BLOCK}

    def through_torch(ld: fastload.DataLoader) -> list[dict]:
        return list(torch.utils.data.DataLoader(ld.dataset, batch_sampler=ld.batch_sampler, collate_fn=ld.collate_fn, num_workers=num_workers))

    def over(location: object, **extra: object) -> fastload.DataLoader:
        return fastload.DataLoader(location, **{"batch_size": 4, "seq_len": SEQ, "block_tokens": BLOCK, "seed": 3, **text, **extra})

    first = over(ds)
    assert same_batches(through_torch(first), list(over(str(parquet))))
    it = iter(first)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    for seq_len in (SEQ, 96):
        resumed = over(ds, seq_len=seq_len)
        resumed.load_state_dict(state)
        mine = through_torch(resumed)
        again = over(str(parquet), seq_len=seq_len)
        again.load_state_dict(state)
        assert len(mine) > 3 and same_batches(mine, list(again))
    # rows made in this process: once for each seq_len (with workers, in each worker)
    assert [len(kept) for kept in ds.made_here().values()] == ([] if num_workers else [2])


# --- a member of a mixture by tokens ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def second(tokenizer_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second token dataset to mix with: the last 600 real paragraphs, backwards (with eos)."""
    root = tmp_path_factory.mktemp("second")
    write_jsonl(root / "b.jsonl", real_paragraphs()[::-1][:600])
    convert(str(root / "b.jsonl"), str(root / "ds"), ConvertOptions(
        source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer_file), append_eos=True, shard_tokens=20_000)), quiet=True)
    return root / "ds"


@pytest.fixture(scope="module")
def second_parquet(second: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The second token dataset's documents as Parquet rows."""
    return write_parquet(tmp_path_factory.mktemp("second-parquet") / "data", documents(second))


def mixed(members: dict[Path, float], **kwargs: object) -> fastload.DataLoader:
    """A loader of the mixture by tokens of ``members`` (paths and weights)."""
    mixture = fastload.mix({str(path): weight for path, weight in members.items()}, by="tokens")
    return fastload.DataLoader(mixture, **{"batch_size": 8, "seq_len": SEQ, "block_tokens": BLOCK, "seed": 3, **kwargs})


@pytest.mark.parametrize(("read_in_place", "num_workers", "batch_format"), [((0,), 0, "next-token"), ((1,), 2, "transformers"),
                                                                            ((0, 1), 2, "next-token")])
def test_a_mixture_with_members_read_in_place_gives_the_token_shards_mixtures_very_batches(
        shards: Path, parquet: Path, second: Path, second_parquet: Path, tokenizer_file: Path, read_in_place: tuple[int, ...],
        num_workers: int, batch_format: str) -> None:
    """The same documents, read in place or from their token shards: the same rows of each member, the same batches,
    epoch after epoch (a member read in place in first or second place, or both)."""
    places = [(shards, parquet), (second, second_parquet)]
    in_place = {places[n][n in read_in_place]: weight for n, weight in enumerate((0.3, 0.7))}
    with (mixed(in_place, tokenizer=tokenizer_file, num_workers=num_workers, batch_format=batch_format) as got,
          mixed({shards: 0.3, second: 0.7}, batch_format=batch_format) as want):
        assert len(got) == len(want) > 20
        for _ in range(2):  # the next epoch too: the members' rows run on through their epochs
            assert same_batches(list(got), list(want))
        assert got.kind.pad_id == want.kind.pad_id != 0


def test_a_text_column_mixes_with_token_shards_as_its_own_token_shards_do(texts: tuple[Path, Path], second: Path, tokenizer_file: Path) -> None:
    text, text_shards = texts
    with mixed({text: 0.5, second: 0.5}, fields=["text"], tokenizer=tokenizer_file, num_workers=2) as got:
        assert same_batches(list(got), list(mixed({text_shards: 0.5, second: 0.5})))


def test_a_mixture_with_a_member_read_in_place_resumes_exactly(parquet: Path, shards: Path, second: Path, tokenizer_file: Path) -> None:
    whole = list(mixed({shards: 0.3, second: 0.7}))
    first = mixed({parquet: 0.3, second: 0.7}, tokenizer=tokenizer_file, num_workers=2)
    it = iter(first)
    for _ in range(6):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = mixed({parquet: 0.3, second: 0.7}, tokenizer=tokenizer_file)
    resumed.load_state_dict(state)
    assert same_batches(list(resumed), whole[6:])


def described_tokens(ld: fastload.DataLoader, steps: int) -> Counter:
    """Every token the described rows of ``steps`` steps of epoch 0 hold: (member's file, row, offset), counted."""
    return Counter((s["shard"], s["document"], s["offset"] + i) for step in range(steps) for row in ld.describe(step, 0) for s in row
                   for i in range(s["tokens"]))


def test_a_mixture_with_a_member_read_in_place_resumes_at_another_world_and_batch_size(parquet: Path, shards: Path, second: Path,
                                                                                       tokenizer_file: Path) -> None:
    """Saved by one rank at batch 8, resumed by two at batch 6: the ranks deliver the all-shards mixture's batches, and the
    epoch's rows, each once (a member's tokens as often as its share of the rows takes it round)."""
    def run(first_member: Path, **extra: object) -> tuple[list[dict], Counter]:
        first = mixed({first_member: 0.3, second: 0.7}, **extra)
        delivered = list(itertools.islice(first, 5))
        state = json.loads(json.dumps(first.state_dict()))
        seen: Counter = Counter()
        for rank in (0, 1):
            view = mixed({first_member: 0.3, second: 0.7}, batch_size=6, rank=rank, world_size=2, **extra)
            view.load_state_dict(state)
            batches = list(view)
            delivered += batches
            seen += described_tokens(view, len(batches) + 5)  # the 5 steps before the resume at their topology (rank 1 had none)
        return delivered, seen

    got, seen = run(parquet, tokenizer=tokenizer_file)
    want, _ = run(shards)
    assert same_batches(got, want)
    whole = mixed({parquet: 0.3, second: 0.7}, tokenizer=tokenizer_file)
    assert seen == described_tokens(whole, len(whole))


def test_describe_names_a_member_read_in_place_its_file_and_row(parquet: Path, second: Path, tokenizer_file: Path) -> None:
    ld = mixed({second: 0.5, parquet: 0.5}, tokenizer=tokenizer_file)
    converted = fastload.open(second)
    shard_numbers = {f"{second}/{shard.path}": n for n, shard in enumerate(converted.index.shards)}
    files: set[str] = set()
    for step, batch in zip(range(12), ld):
        for r, row in enumerate(ld.describe(step)):
            column = 0
            for s in row:
                assert s["weights"] == [0.5, 0.5]
                if s["shard"].startswith(f"{second}/"):
                    ids = converted.reader(shard_numbers[s["shard"]]).document(s["document"]).tolist()
                else:
                    member, name = s["shard"].rsplit("/", 1)
                    assert member == str(parquet)
                    files.add(name)
                    ids = row_ids(parquet, name, s["document"])
                assert batch["input_ids"][r, column : column + s["tokens"]].tolist() == ids[s["offset"] : s["offset"] + s["tokens"]]
                column += s["tokens"]
    assert files == {"a.parquet", "b.parquet"}


def test_a_member_read_in_place_is_checked_against_the_mixtures_tokenizer_naming_it(parquet: Path, shards: Path, second: Path,
                                                                                     second_parquet: Path, tokenizer_file: Path,
                                                                                     tmp_path: Path, cache: Path) -> None:
    """Before its column is counted: no document table is made for a member refused."""
    with pytest.raises(ValueError, match=re.escape(f"mix: member 0 ({parquet}) reads token ids in place with no tokenizer= to check "
                                                   f"them against member 1's ({second})")) as error:
        mixed({parquet: 0.5, second: 0.5})
    assert "\n" not in str(error.value)
    other = tmp_path / "other.json"  # the same tokenizer, written otherwise: another file, another identity
    other.write_text(json.dumps(json.loads(tokenizer_file.read_text()), indent=1))
    with pytest.raises(ValueError, match=re.escape(f"mix: member 0 ({parquet}) is read with a tokenizer= other than member 1's "
                                                   f"({second}): one id would mean two tokens")):
        mixed({parquet: 0.5, second: 0.5}, tokenizer=other)
    assert not list((cache / "in-place").glob("*.docs"))
    with pytest.raises(ValueError, match=re.escape(f"mix: member 1 ({second_parquet}): {second_parquet}: no column 'tokens' of token ids")):
        mixed({second: 0.5, second_parquet: 0.5}, fields=["tokens"], tokenizer=tokenizer_file)
    with pytest.raises(ValueError, match=re.escape("tokenizer= name the column (and its tokenizer) of data read in place; mix(")):
        mixed({shards: 0.5, second: 0.5}, tokenizer=tokenizer_file)
    # members read in place only: with no tokenizer, ids from 0 (and rows padded with 0), as one dataset read in place
    bare, named = mixed({parquet: 0.3, second_parquet: 0.7}), mixed({parquet: 0.3, second_parquet: 0.7}, tokenizer=tokenizer_file)
    for mine, theirs in zip(bare, named, strict=True):
        real = theirs["attention_mask"].bool()
        assert torch.equal(mine["labels"], theirs["labels"]) and torch.equal(mine["input_ids"][real], theirs["input_ids"][real])


def test_a_member_read_in_place_shorter_than_a_row_is_refused_naming_it(shards: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    docs = documents(shards)[:2]
    tiny, tokens = tmp_path / "tiny", sum(len(doc) for doc in docs)
    tiny.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))}), str(tiny / "a.parquet"))
    named = fastload.open(tiny).location  # a folder of one file: the file
    with pytest.raises(ValueError, match=re.escape(f"mix: member 1 ({named}) holds {tokens} tokens, fewer than a row of seq_len={tokens + 1}")):
        mixed({shards: 0.5, tiny: 0.5}, seq_len=tokens + 1, tokenizer=tokenizer_file)
    assert len(list(mixed({shards: 0.5, tiny: 0.5}, seq_len=tokens, tokenizer=tokenizer_file))) > 0


def test_a_member_read_in_place_over_http_gives_the_local_files_batches(parquet: Path, second: Path, tokenizer_file: Path,
                                                                        tmp_path: Path) -> None:
    from tests.formats.test_parquet_in_place import RangeServer

    server = RangeServer(parquet)
    try:
        remote = fastload.open([f"{server.url}/{name}" for name in ("a.parquet", "b.parquet")], cache_dir=tmp_path / "remote-cache")
        mixture = fastload.mix({remote: 0.3, str(second): 0.7}, by="tokens")
        with fastload.DataLoader(mixture, batch_size=8, seq_len=SEQ, block_tokens=BLOCK, seed=3, tokenizer=tokenizer_file, num_workers=2) as ld:
            got = list(ld)
    finally:
        server.shutdown()
        server.server_close()
    assert same_batches(got, list(mixed({parquet: 0.3, second: 0.7}, tokenizer=tokenizer_file)))
    assert [name for name, asked in server.gets if name.endswith(".parquet") and asked is None] == []  # ranges only


def test_mix_names_a_member_that_does_not_mix_by_what_it_holds(shards: Path, parquet: Path, tmp_path: Path) -> None:
    from tests.conftest import demo_dataset

    images = fastload.open(demo_dataset(tmp_path / "images", 8))
    with pytest.raises(ValueError, match=re.escape(f"mix: member 1 ({images.location}) holds neither tokens nor data read in place")):
        fastload.mix({str(parquet): 0.5, images: 0.5}, by="tokens")
    with pytest.raises(ValueError, match=re.escape(f"mix: member 0 ({shards}) holds tokens: token datasets are mixed by='tokens'")):
        fastload.mix({str(shards): 0.5, str(parquet): 0.5})

"""The token loader: rows for each packing mode, labels and positions, every token of an epoch
exactly once over the ranks, exact and elastic resume (real gloo ranks, saved with 4 and resumed
with 3), best-fit's padding against an offline best-fit decreasing, mixing by tokens, describe, stats."""

from __future__ import annotations

import gc
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fastload
from fastload.converters import ConvertOptions, convert
from fastload.converters.convert_options import TokenizeOptions
from fastload.storage.verify import verify_dataset
from fastload.text.packing import padding_fraction
from tests.conftest import cli_env
from tests.storage.test_remote import DatasetServer
from tests.text.conftest import VOCAB, real_paragraphs, write_jsonl

SEQ = 128
BLOCK = 4096


@pytest.fixture(scope="module")
def tokens(tokenizer_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real paragraphs (with eos) in token shards of about 20,000 tokens."""
    root = tmp_path_factory.mktemp("tokens")
    write_jsonl(root / "docs.jsonl", real_paragraphs())
    convert(str(root / "docs.jsonl"), str(root / "ds"), ConvertOptions(
        source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer_file), append_eos=True, shard_tokens=20_000)), quiet=True)
    return root / "ds"


def loader(path, **kwargs) -> fastload.DataLoader:  # type: ignore[no-untyped-def]  # a folder, or an opened dataset
    return fastload.DataLoader(str(path) if isinstance(path, Path) else path, **{"batch_size": 4, "seq_len": SEQ, "block_tokens": BLOCK, "seed": 3, **kwargs})


def covered(ld, epoch: int, steps: int, world: int) -> Counter:
    """Every (shard, document, token offset) the rows of ``steps`` global steps hold, over all ranks, counted."""
    seen: Counter = Counter()
    for rank in range(world):
        view = loader(ld.dataset.root, rank=rank, world_size=world, packing=ld.kind.tokens.packing.value)
        for step in range(steps):
            for row in view.describe(step, epoch):
                for s in row:
                    seen.update((s["shard"], s["document"], s["offset"] + i) for i in range(s["tokens"]))
    return seen


def all_tokens(path: Path) -> Counter:
    ds = fastload.open(path)
    out: Counter = Counter()
    for number, shard in enumerate(ds.index.shards):
        reader = ds.reader(number)
        for d in range(len(reader)):
            start, end = reader.bounds(d)
            out.update((shard.path, d, i) for i in range(end - start))
    return out


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_every_token_of_an_epoch_exactly_once_over_the_ranks(tokens: Path, packing: str) -> None:
    ld = loader(tokens, rank=0, world_size=3, packing=packing)
    steps = len(ld)
    assert covered(ld, 0, steps, 3) == all_tokens(tokens)  # each token once: no token twice, none left out


def assert_batch_is_what_describe_names(ld: fastload.DataLoader, batch: dict, step: int, epoch: int) -> None:
    """Each row of ``batch`` holds the segments ``describe(step, epoch)`` names: their tokens, positions
    counted from each segment's start, and labels that are the next token of the same document (the
    ignore index after its last token and on padding)."""
    ds = ld.dataset
    for r, row in enumerate(ld.describe(step, epoch)):
        column = 0
        for s in row:
            shard = next(n for n, info in enumerate(ds.index.shards) if info.path == s["shard"])
            doc = ds.reader(shard).document(s["document"])
            piece = doc[s["offset"] : s["offset"] + s["tokens"]]
            assert batch["input_ids"][r, column : column + s["tokens"]].tolist() == piece.tolist()
            assert batch["position_ids"][r, column : column + s["tokens"]].tolist() == list(range(s["tokens"]))
            expected = doc[s["offset"] + 1 : s["offset"] + s["tokens"] + 1].tolist()
            expected += [-100] * (s["tokens"] - len(expected))  # the document's last token: nothing to predict
            assert batch["labels"][r, column : column + s["tokens"]].tolist() == expected, (step, r, s)
            column += s["tokens"]
        assert batch["attention_mask"][r].sum() == column and (batch["labels"][r, column:] == -100).all()


def test_batches_hold_the_tokens_describe_names_with_labels_and_positions(tokens: Path) -> None:
    ld = loader(tokens, packing="best-fit")
    batch = next(iter(ld))
    assert batch["input_ids"].shape == (4, SEQ) and batch["input_ids"].dtype == torch.int64
    assert_batch_is_what_describe_names(ld, batch, 0, 0)
    bounds = batch["cu_seqlens"].tolist()
    assert bounds[0] == 0 and bounds[-1] == 4 * SEQ and bounds == sorted(bounds) and batch["max_seqlen"] <= SEQ


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_a_document_ending_at_a_block_edge_has_no_label_after_its_last_token(tokenizer_file: Path, tmp_path: Path, packing: str) -> None:
    """The block edge falls exactly after a document: its last label is the ignore index, not the
    first token of the document after it (which the next block holds)."""
    write_jsonl(tmp_path / "docs.jsonl", real_paragraphs()[:40])
    convert(str(tmp_path / "docs.jsonl"), str(tmp_path / "ds"), ConvertOptions(
        source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer_file), append_eos=True)), quiet=True)
    reader = fastload.open(tmp_path / "ds").reader(0)
    block = sum(len(reader.document(d)) for d in range(3))  # the first block ends where document 2 does
    ld = loader(tmp_path / "ds", packing=packing, seq_len=32, block_tokens=block, packing_window=block)
    ended_at_edge = 0
    for step, batch in enumerate(ld):
        assert_batch_is_what_describe_names(ld, batch, step, 0)
        ended_at_edge += sum(s["document"] == 2 and s["offset"] + s["tokens"] == len(reader.document(2)) for row in ld.describe(step, 0) for s in row)
    assert ended_at_edge == 1


def test_concat_rows_are_full_and_pad_rows_one_document_each(tokens: Path) -> None:
    concat = loader(tokens, packing="concat")
    masks = [b["attention_mask"] for b in concat]
    assert all(m.all() for m in masks[:-1])  # no padding but in the epoch's last row
    pad = loader(tokens, packing="pad", batch_size=8)
    docs = fastload.open(tokens).index.num_samples
    assert len(pad) == -(-docs // 8)
    rows = [len(row) for step in range(len(pad)) for row in pad.describe(step)]
    assert rows.count(1) == docs and set(rows) <= {0, 1}


@pytest.mark.parametrize("packing", ["concat", "best-fit", "pad"])
def test_worker_processes_make_the_same_batches_as_the_training_process(tokens: Path, packing: str) -> None:
    inline = list(loader(tokens, packing=packing))
    with loader(tokens, packing=packing, num_workers=2, prefetch_factor=3) as ld:
        made = list(ld)
        pool = ld.kind.engine.pool
        assert pool is not None and all(p.is_alive() for p in pool.processes) and len(pool.processes) == 2
        assert ld.stats.epochs[-1].busy_processes() == 2  # both workers made batches; none were made here
        assert len(made) == len(inline) and all(
            a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(made, inline))


def test_the_transformers_format_lines_labels_up_with_the_inputs(tokens: Path) -> None:
    nt = next(iter(loader(tokens, packing="best-fit")))
    tf = next(iter(loader(tokens, packing="best-fit", batch_format="transformers", num_workers=1)))
    assert set(tf) == {"input_ids", "labels", "position_ids"}  # no attention mask: the model separates documents by position
    assert torch.equal(tf["input_ids"], nt["input_ids"]) and torch.equal(tf["position_ids"], nt["position_ids"])
    first = tf["position_ids"] == 0  # each segment's (and the padding's) first token
    assert torch.equal(tf["labels"], torch.where(first | (nt["attention_mask"] == 0), -100, tf["input_ids"]))
    inside = ~first[:, 1:]  # the model shifts them: its targets are the next-token labels, within each segment
    assert torch.equal(tf["labels"][:, 1:][inside], nt["labels"][:, :-1][inside])


def test_a_token_dataset_over_http_loads_as_the_local_one_and_verifies(tokens: Path, tmp_path: Path) -> None:
    root = tmp_path / "served"
    shutil.copytree(tokens, root)
    server = DatasetServer(root)
    try:
        report = verify_dataset(server.url)
        assert report.ok and report.shards == len(fastload.open(tokens).index.shards)  # each shard and its document table fetched, checked
        remote = fastload.open(server.url, cache_dir=tmp_path / "cache")
        got = [b["input_ids"] for b in loader(remote, packing="best-fit", num_workers=2)]
        want = [b["input_ids"] for b in loader(tokens, packing="best-fit")]
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_a_remote_token_datasets_next_shards_are_fetched_before_the_batches_that_read_them(tokens: Path, tmp_path: Path, packing: str) -> None:
    root = tmp_path / "served"
    shutil.copytree(tokens, root)
    server = DatasetServer(root)
    try:
        remote = fastload.open(server.url, cache_dir=tmp_path / "cache")
        kwargs = {"packing": packing, "packing_window": 4 * BLOCK}  # best-fit: windows of 4 blocks, several in the epoch
        local = loader(tokens, **kwargs)
        read_by = [{s["shard"] for row in local.describe(step) for s in row} for step in range(len(local))]
        if packing == "concat":
            part = BLOCK // (SEQ * 4)  # the batches cut from batch 0's block of the stream
        else:  # the batches before the first holding a row of the next window (the state's packing_cursor names the next row's)
            part = next(step for step, _ in enumerate(iter(local)) if local.state_dict()["packing_cursor"][0] > 0)
        upcoming = read_by[part] - set().union(*read_by[:part])  # what the next block's (window's) first batch reads, and none before
        assert upcoming
        got = iter(loader(remote, **kwargs))  # in the training process: it reads a shard only when its batch is made
        batches = [next(got)["input_ids"].clone()]
        deadline = time.monotonic() + 30  # only guards a hang: without prefetching these are never fetched while the loop waits
        while not all(server.counts[name] for name in upcoming) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(server.counts[name] for name in upcoming), (sorted(upcoming), server.counts)
        batches += [batch["input_ids"] for batch in got]
        want = [batch["input_ids"] for batch in local]
        assert len(batches) == len(want) and all(torch.equal(a, b) for a, b in zip(batches, want))
        assert all(server.counts[shard.path] == 1 for shard in remote.index.shards), server.counts  # fetched ahead, read from the cache: once each
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("kind", ["pad", "mixture"])
def test_a_remote_token_dataset_padded_or_in_a_mixture_loads_as_the_local_one_each_shard_fetched_once(tokens: Path, tokenizer_file: Path,
                                                                                                      tmp_path: Path, kind: str) -> None:
    root = tmp_path / "served"
    shutil.copytree(tokens, root)
    server = DatasetServer(root)
    try:
        remote = fastload.open(server.url, cache_dir=tmp_path / "cache")
        if kind == "pad":
            got, want = loader(remote, packing="pad", num_workers=2), loader(tokens, packing="pad")
        else:
            second = str(token_member(tokenizer_file, tmp_path))
            got = loader(fastload.mix({remote: 0.3, second: 0.7}, by="tokens"), num_workers=2)
            want = loader(fastload.mix({str(tokens): 0.3, second: 0.7}, by="tokens"))
        delivered, expected = [b["input_ids"] for b in got], [b["input_ids"] for b in want]
        assert len(delivered) == len(expected) and all(torch.equal(a, b) for a, b in zip(delivered, expected))
        assert all(server.counts[shard.path] == 1 for shard in remote.index.shards), server.counts  # fetched ahead or on demand: once each
    finally:
        server.shutdown()
        server.server_close()


def offline_best_fit_decreasing(lengths: list[int], capacity: int) -> int:
    """The rows an offline best-fit decreasing packs ``lengths`` into (a plain reference: each
    item, longest first, into the open row it leaves least room in, else a new row)."""
    free: list[int] = []
    for size in sorted(lengths, reverse=True):
        fits = [r for r, room in enumerate(free) if room >= size]
        if fits:
            best = min(fits, key=lambda r: free[r])
            free[best] -= size
        else:
            free.append(capacity - size)
    return len(free)


def window_pieces(path: Path, window: int, block: int, capacity: int) -> list[list[int]]:
    """Each window of ``window`` tokens of the dataset (shards one after another): the lengths of
    the documents' parts inside it, cut at every ``block`` edge (as the loader's stream cuts them)
    and into ``capacity``-long parts."""
    ds = fastload.open(path)
    bounds, base = [np.zeros(1, dtype=np.int64)], 0
    for number, shard in enumerate(ds.index.shards):
        bounds.append(ds.reader(number).offsets()[1:].astype(np.int64) + base)
        base += shard.tokens
    edges = np.concatenate(bounds)
    starts, ends = edges[:-1], edges[1:]
    windows = []
    for lo in range(0, base, window):
        pieces: list[int] = []
        for b in range(lo, min(lo + window, base), block):
            inside = np.minimum(ends, b + block) - np.maximum(starts, b)
            for piece in inside[inside > 0].tolist():
                pieces += [capacity] * (piece // capacity) + ([piece % capacity] if piece % capacity else [])
        windows.append(pieces)
    return windows


def test_best_fit_padding_is_within_a_point_of_an_offline_best_fit_decreasing_over_the_same_windows(tokens: Path) -> None:
    ld = loader(tokens, packing="best-fit", shuffle=False, packing_window=4 * BLOCK)  # windows: 4 blocks, in token order
    rows = real = 0
    for batch in ld:
        mask = batch["attention_mask"]
        rows += int(mask.any(dim=1).sum())
        real += int(mask.sum())
    delivered = 1 - real / (rows * SEQ)
    windows = window_pieces(tokens, 4 * BLOCK, BLOCK, SEQ)
    assert len(windows) > 4
    offline_rows = sum(offline_best_fit_decreasing(pieces, SEQ) for pieces in windows)
    offline = 1 - sum(map(sum, windows)) / (offline_rows * SEQ)
    assert real == fastload.open(tokens).index.num_tokens
    assert abs(delivered - offline) <= 0.01, (delivered, offline)
    assert padding_fraction([[0]], np.array([SEQ // 2]), SEQ) == 0.5


@pytest.mark.parametrize("seq_len", [SEQ, 48])
def test_best_fits_len_is_the_rows_it_delivers_counted_without_packing(tokens: Path, seq_len: int) -> None:
    """``len(loader)`` counts each window's rows without packing it: the batches delivered, in
    token order (where the rows are the offline best-fit decreasing's, exactly) and shuffled, over
    two epochs of different windows, with and without the last short batch."""
    ordered = loader(tokens, packing="best-fit", seq_len=seq_len, shuffle=False, packing_window=2 * BLOCK, batch_size=1)
    windows = window_pieces(tokens, 2 * BLOCK, BLOCK, seq_len)
    assert len(windows) > 8 and len(ordered) == sum(offline_best_fit_decreasing(p, seq_len) for p in windows)
    assert len(ordered) == sum(1 for _ in ordered)
    for drop_last in (False, True):
        shuffled = loader(tokens, packing="best-fit", seq_len=seq_len, packing_window=2 * BLOCK, drop_last=drop_last)
        for epoch in range(2):
            shuffled.set_epoch(epoch)
            counted = len(shuffled)
            assert counted == sum(1 for _ in shuffled) and abs(4 * counted - len(ordered)) <= 0.02 * len(ordered) + 4  # other windows: about as many rows


@pytest.mark.parametrize("packing", ["concat", "best-fit", "pad"])
def test_resume_mid_epoch_continues_exactly(tokens: Path, packing: str) -> None:
    whole = [b["input_ids"] for b in loader(tokens, packing=packing)]
    first = loader(tokens, packing=packing)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = loader(tokens, packing=packing)
    resumed.load_state_dict(state)
    rest = [b["input_ids"] for b in resumed]
    assert len(rest) == len(whole) - 5 and all(torch.equal(a, b) for a, b in zip(rest, whole[5:]))
    if packing == "best-fit":
        assert state["packing_cursor"][1] <= state["samples_consumed"]
    nxt = [b["input_ids"] for b in resumed]  # the next epoch: another order
    assert not all(torch.equal(a, b) for a, b in zip(nxt, whole))


def _rank_main(rank: int, world: int, init: str, path: str | list, out: str, kwargs: dict, state: dict | None,
               stop_after: int | None) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    dataset = fastload.mix({p: w for p, w in path}, by="tokens") if isinstance(path, list) else path
    ld = fastload.DataLoader(dataset, **kwargs)
    step = 0
    if state is not None:
        ld.load_state_dict(state["loader"])
        step = state["step"]
    delivered, saved = [], None
    for batch in ld:
        ones = torch.ones(1)
        dist.all_reduce(ones)  # a collective a step, as DDP: hangs if the ranks' step counts differ
        for r, segments in enumerate(ld.describe(step, 0)):  # the positions each row holds, with the ids delivered there
            row, column = [], 0
            for s in segments:
                row.append([s["shard"], s["document"], s["offset"], batch["input_ids"][r, column : column + s["tokens"]].tolist()])
                column += s["tokens"]
            assert int(batch["attention_mask"][r].sum()) == column
            delivered.append(row)
        step += 1
        if stop_after is not None and step == stop_after:
            saved = {"loader": ld.state_dict(), "step": step}
            break
    Path(out, f"rank{rank}.json").write_text(json.dumps({"delivered": delivered, "batches": step, "state": saved}))
    ld.close()
    dist.barrier()
    dist.destroy_process_group()


def run_ranks(tmp_path: Path, world: int, path: Path | list, kwargs: dict, state: dict | None = None, stop_after: int | None = None) -> list[dict]:
    out = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    out.mkdir()
    mp.spawn(_rank_main, args=(world, str(out / "init"), path, str(out), kwargs, state, stop_after), nprocs=world, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def positions_and_ids(runs: list[dict]) -> tuple[Counter, dict]:
    """Every (shard, document, offset) the runs' batches hold, counted, and the id delivered at each."""
    seen: Counter = Counter()
    ids: dict = {}
    for run in runs:
        for row in run["delivered"]:
            for shard, document, offset, tokens in row:
                for i, token in enumerate(tokens):
                    seen[(shard, document, offset + i)] += 1
                    ids[(shard, document, offset + i)] = token
    return seen, ids


def every_position(path: Path) -> dict:
    """Each (shard, document, offset) of the dataset and the id stored there."""
    ds = fastload.open(path)
    out = {}
    for number, shard in enumerate(ds.index.shards):
        reader = ds.reader(number)
        for d in range(len(reader)):
            for i, token in enumerate(reader.document(d).tolist()):
                out[(shard.path, d, i)] = token
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("packing", "num_workers"), [("concat", 0), ("best-fit", 2)])
def test_saved_with_4_gloo_ranks_resumed_with_3_every_token_position_once(tokens: Path, tmp_path: Path, packing: str, num_workers: int) -> None:
    kwargs = {"batch_size": 2, "seq_len": SEQ, "packing": packing, "block_tokens": BLOCK, "seed": 5, "num_workers": num_workers}
    first = run_ranks(tmp_path, 4, tokens, kwargs, stop_after=6)
    assert len({r["batches"] for r in first}) == 1
    second = run_ranks(tmp_path, 3, tokens, kwargs, state=first[0]["state"])
    assert len({r["batches"] for r in second}) == 1  # every rank the same number of steps
    seen, ids = positions_and_ids(first + second)
    stored = every_position(tokens)
    assert set(seen) == set(stored) and set(seen.values()) == {1}  # every token position of the epoch exactly once
    assert ids == stored  # and the id delivered at each is the one stored there


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_mixture_by_tokens_saved_with_4_gloo_ranks_resumes_with_3_exactly(tokens: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    second_member = token_member(tokenizer_file, tmp_path)
    members = [[str(tokens), 0.3], [str(second_member), 0.7]]
    kwargs = {"batch_size": 2, "seq_len": SEQ, "block_tokens": BLOCK, "seed": 5, "num_workers": 1}
    first = run_ranks(tmp_path, 4, members, kwargs, stop_after=5)
    resumed = run_ranks(tmp_path, 3, members, kwargs, state=first[0]["state"])
    assert len({r["batches"] for r in resumed}) == 1
    whole = run_ranks(tmp_path, 1, members, kwargs)  # the same epoch on one rank
    rows = lambda runs: Counter(tuple((s[0], s[1], s[2], tuple(s[3])) for s in row) for run in runs for row in run["delivered"] if row)  # noqa: E731
    assert rows(first + resumed) == rows(whole)  # the epoch's rows, each exactly once, whatever the topology


def token_member(tokenizer_file: Path, tmp_path: Path) -> Path:
    """A second token dataset: the real paragraphs backwards, the last 800."""
    write_jsonl(tmp_path / "b.jsonl", real_paragraphs()[::-1][:800])
    convert(str(tmp_path / "b.jsonl"), str(tmp_path / "b"), ConvertOptions(
        source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer_file), shard_tokens=20_000)), quiet=True)
    return tmp_path / "b"


@pytest.mark.slow
def test_mixing_by_tokens_keeps_each_share_within_half_a_point_over_every_10m_tokens(tokens: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    second = token_member(tokenizer_file, tmp_path)
    mixture = fastload.mix({str(tokens): 0.3, str(second): 0.7}, by="tokens")
    seq = 2048
    ld = fastload.DataLoader(mixture, batch_size=64, seq_len=seq, num_workers=2)
    member_tokens: list[tuple[int, int]] = []  # (member, tokens) of each row delivered, in order
    epoch = 0
    while len(member_tokens) * seq < 25_000_000:  # the members hold ~0.8M tokens: dozens of member epochs
        for step, b in enumerate(ld):
            for row, segments in zip(b["attention_mask"].sum(dim=1).tolist(), ld.describe(step, epoch)):
                if row:
                    owners = {0 if s["shard"].startswith(str(tokens)) else 1 for s in segments}
                    assert len(owners) == 1 and row == seq  # every row seq_len tokens of one member
                    member_tokens.append((owners.pop(), row))
        epoch += 1
    ld.close()
    first = np.asarray([t if m == 0 else 0 for m, t in member_tokens], dtype=np.float64)
    every = np.asarray([t for _, t in member_tokens], dtype=np.float64)
    window = int(10_000_000 // seq)  # rows of 10M tokens
    share = np.convolve(first, np.ones(window), "valid") / np.convolve(every, np.ones(window), "valid")
    assert len(share) > window and np.abs(share - 0.3).max() <= 0.005  # every window of 10M tokens, sliding by a row
    prefix = np.cumsum(first) / seq - 0.3 * np.arange(1, len(first) + 1)
    assert np.abs(prefix).max() <= 1  # after any number of rows, within a row of 30%


def test_a_mixture_of_datasets_of_two_tokenizers_is_refused(tokens: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    other = Tokenizer(models.BPE())
    other.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    other.train_from_iterator(real_paragraphs()[:200], trainer=trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    other.save(str(tmp_path / "other.json"))
    write_jsonl(tmp_path / "b.jsonl", real_paragraphs()[:50])
    convert(str(tmp_path / "b.jsonl"), str(tmp_path / "b"), ConvertOptions(source="jsonl", layout="tokens",
                                                                          tokens=TokenizeOptions(str(tmp_path / "other.json"))), quiet=True)
    with pytest.raises(ValueError, match=r"mix: member 1 \(.*b\) was not tokenized with member 0's tokenizer"):
        fastload.mix({str(tokens): 0.5, str(tmp_path / "b"): 0.5}, by="tokens")


def test_a_mixture_member_shorter_than_a_row_is_refused_at_construction_naming_it(tokens: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    """Every row of a mixture by tokens is seq_len tokens of one member, cut from its epochs one
    after another: a member of fewer tokens than a row made each of its rows read that many of its
    epochs (8-10 s for two batches at seq_len 32,768), so it is refused, naming the member; one
    of exactly a row is taken (a row then spans at most two of its epochs)."""
    write_jsonl(tmp_path / "tiny.jsonl", real_paragraphs()[:3])
    convert(str(tmp_path / "tiny.jsonl"), str(tmp_path / "tiny"), ConvertOptions(
        source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer_file))), quiet=True)
    tiny = fastload.open(tmp_path / "tiny").index.num_tokens
    mixture = fastload.mix({str(tokens): 0.5, str(tmp_path / "tiny"): 0.5}, by="tokens")
    with pytest.raises(ValueError, match=re.escape(f"mix: member 1 ({tmp_path / 'tiny'}) holds {tiny} tokens, fewer than a row "
                                                   f"of seq_len={tiny + 1}: each of its rows would repeat it 2 times over")):
        fastload.DataLoader(mixture, batch_size=2, seq_len=tiny + 1)
    rows = fastload.DataLoader(mixture, batch_size=2, seq_len=tiny)
    assert sum(1 for _ in rows) == len(rows) > 0


def test_a_mixture_resumes_mid_epoch_exactly(tokens: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    mixture = fastload.mix({str(tokens): 0.3, str(token_member(tokenizer_file, tmp_path)): 0.7}, by="tokens")
    whole = [b["input_ids"] for b in fastload.DataLoader(mixture, batch_size=8, seq_len=SEQ, block_tokens=BLOCK)]
    first = fastload.DataLoader(mixture, batch_size=8, seq_len=SEQ, block_tokens=BLOCK, num_workers=2)
    it = iter(first)
    for _ in range(6):
        next(it)
    state = first.state_dict()
    again = fastload.DataLoader(mixture, batch_size=8, seq_len=SEQ, block_tokens=BLOCK)
    again.load_state_dict(state)
    rest = [b["input_ids"] for b in again]
    assert len(rest) == len(whole) - 6 and all(torch.equal(a, b) for a, b in zip(rest, whole[6:]))


def test_stats_count_tokens_and_seq_len_needs_a_token_dataset(tokens: Path) -> None:
    ld = loader(tokens)
    for _ in ld:
        pass
    assert ld.stats.tokens == fastload.open(tokens).index.num_tokens and ld.stats.epochs[0].complete
    with pytest.raises(ValueError, match="seq_len must be a positive number of tokens"):
        fastload.DataLoader(fastload.open(tokens), seq_len=0)


def test_a_token_dataset_dropped_without_close_leaves_no_descriptor_open(tokens: Path) -> None:
    """Documents read from datasets opened and dropped unclosed: each one's token files close with it."""

    def open_descriptors() -> int:
        gc.collect()
        return len(os.listdir("/proc/self/fd"))

    fastload.open(tokens)[0]
    before = open_descriptors()
    for _ in range(10):
        ds = fastload.open(tokens)
        assert all(len(ds[i]["tokens"]) for i in range(0, len(ds), max(1, len(ds) // 20)))
        del ds
    assert open_descriptors() == before


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_a_state_saved_on_the_last_batch_then_that_epoch_set_again_is_not_replayed(tokens: Path, packing: str) -> None:
    """The token loader as the image loader: a checkpoint on the epoch's last batch, resumed with
    set_epoch(the loop's epoch), yields nothing more of it, then the next epoch whole; describe(step)
    in the loop body names the batch just delivered."""
    runs: dict[int, list[torch.Tensor]] = {}
    with loader(tokens, packing=packing, num_workers=2) as ld:
        for epoch in (0, 1):
            ld.set_epoch(epoch)
            runs[epoch] = []
            for step, batch in enumerate(ld):
                runs[epoch].append(batch["input_ids"].clone())
                assert ld.describe(step) == ld.describe(step, epoch)
                if epoch == 0:
                    saved = ld.state_dict()
    assert (saved["epoch"], saved["samples_consumed"]) == (1, 0)
    with loader(tokens, packing=packing) as ld:
        ld.load_state_dict(saved)
        ld.set_epoch(0)
        assert [batch for batch in ld] == []
        ld.set_epoch(1)
        got = [batch["input_ids"] for batch in ld]
    assert len(got) == len(runs[1]) and all(torch.equal(a, b) for a, b in zip(got, runs[1]))


@pytest.mark.parametrize(("packing", "other"), [("concat", {"block_tokens": 2 * BLOCK}),
                                               ("best-fit", {"block_tokens": 2 * BLOCK, "packing_window": 8 * BLOCK}),  # 4 blocks a window, as saved
                                               ("best-fit", {"packing_window": 8 * BLOCK})])
def test_a_state_is_refused_by_a_loader_of_another_block_size_or_window(tokens: Path, packing: str, other: dict) -> None:
    kwargs = {"packing": packing, "packing_window": 4 * BLOCK}
    first = loader(tokens, **kwargs)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    loader(tokens, **kwargs).load_state_dict(state)  # the same loader takes it
    with pytest.raises(ValueError, match=f"state was saved with {next(iter(other))}="):  # named (before: the identity's "another dataset")
        loader(tokens, **{**kwargs, **other}).load_state_dict(state)


def test_arguments_are_checked_by_name_and_numpy_integers_taken(tokens: Path) -> None:
    """A NumPy integer is a whole number of tokens; a missing or wrong one, or an unknown packing or
    batch format, is a ValueError naming the argument (and the choices) before any batch."""
    with loader(tokens, seq_len=np.int64(SEQ), batch_size=np.int64(2)) as ld:
        assert next(iter(ld))["input_ids"].shape == (2, SEQ)
    for kwargs, message in [({"ignore_index": None}, "ignore_index must be a whole number of tokens, got None"),
                            ({"seq_len": 0}, "seq_len must be a positive number of tokens, got 0"),
                            ({"seq_len": True}, "seq_len must be a positive number of tokens, got True"),
                            ({"block_tokens": 2.5}, "block_tokens must be a positive number of tokens, got 2.5"),
                            ({"packing": "bestfit"}, "packing must be one of 'concat', 'best-fit', 'pad', got 'bestfit'"),
                            ({"batch_format": "hf"}, "batch_format must be one of 'next-token', 'transformers', got 'hf'")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            loader(tokens, **kwargs)


IMPOSSIBLE_STATES = [  # (field, value, what the error names)
    ("samples_consumed", -4, "samples_consumed=-4 is less than 0"),
    ("samples_consumed", 10**9, "samples_consumed=1000000000"),  # past the epoch's end (best-fit: its cursor's window)
    ("samples_consumed", "8", "samples_consumed='8' is not a whole number"),
    ("epoch", -1, "epoch=-1 is less than 0"),
    ("world_size", 0, "world_size=0 is less than 1"),
    ("batch_size", 0, "batch_size=0 is less than 1"),
    ("resumed_from", [[0, 4, 4]], "resumed_from[0].world_size=0 is less than 1"),
    ("resumed_from", [[2, 4, 400]], "resumed_from [[2, 4, 400]] does not ascend to samples_consumed="),
    ("resumed_from", [[2, 4]], "resumed_from holds [2, 4], not a (world_size, batch_size, samples_consumed) triple"),
]


@pytest.mark.parametrize("kind", ["images", "tokens concat", "tokens best-fit", "tokens pad"])
@pytest.mark.parametrize("field,value,named", IMPOSSIBLE_STATES)
def test_an_impossible_state_is_refused_naming_the_field_by_every_loader(tokens: Path, clean: Path, kind: str, field: str,
                                                                         value: object, named: str) -> None:
    """One validation for images and tokens: a state no loader could have saved is a ValueError
    naming the field, never an epoch that repeats, drops or crashes (before: only the image loader
    refused a position past the epoch, and only once it iterated)."""
    def make() -> fastload.DataLoader:
        if kind == "images":
            return fastload.DataLoader(clean, batch_size=4, transform=fastload.transforms.val(16))
        return loader(tokens, packing=kind.split()[1], packing_window=2 * BLOCK)

    saved = make()
    it = iter(saved)
    next(it), next(it)
    state = saved.state_dict()
    honest = make()
    honest.load_state_dict(state)  # the state as saved loads
    assert len(list(honest)) == len(saved) - 2
    with pytest.raises(ValueError) as raised:
        make().load_state_dict({**state, field: value})
    message = str(raised.value)
    assert message.startswith("loader state: ") and named in message and len(message.splitlines()) == 1


def test_a_best_fit_cursor_past_the_epoch_or_disagreeing_with_the_position_is_refused(tokens: Path) -> None:
    """best-fit's packing_cursor (the window holding the next row, that window's first row) must
    name a window of the epoch that starts where the windows before it can end and holds the row."""
    saved = loader(tokens, packing="best-fit", packing_window=2 * BLOCK)
    it = iter(saved)
    for _ in range(40):
        next(it)
    state = saved.state_dict()
    window, first = state["packing_cursor"]
    assert window >= 2, "the position lies past the first windows"
    honest = loader(tokens, packing="best-fit", packing_window=2 * BLOCK)
    honest.load_state_dict(state)
    assert len(list(honest)) == len(saved) - 40
    for cursor, named in [([10**6, 0], "names window 1000000, past epoch 0's"),
                          ([0, 0], "disagrees with samples_consumed=160"),
                          ([window + 1, first], "disagrees with samples_consumed=160"),
                          ([window, 0], "disagrees with samples_consumed=160"),
                          ([window, -1], "is not a (window, first row) pair"),
                          ([window, first, 0], "is not a (window, first row) pair")]:
        with pytest.raises(ValueError, match=re.escape(f"loader state: packing_cursor={cursor!r} {named}")):
            loader(tokens, packing="best-fit", packing_window=2 * BLOCK).load_state_dict({**state, "packing_cursor": cursor})
    with pytest.raises(ValueError, match=r"packing_cursor=\[0, 0\], but only packing='best-fit' has one"):
        concat = loader(tokens)
        concat.load_state_dict({**concat.state_dict(), "packing_cursor": [0, 0]})


TRUNCATE_MID_EPOCH = """
import os, sys
from pathlib import Path
import fastload
root, suffix, workers = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
loader = fastload.DataLoader(str(root), batch_size=4, seq_len=128, block_tokens=4096, seed=3, num_workers=workers)
batches = iter(loader)
for _ in range(100):
    next(batches)
for path in root.glob("*" + suffix):
    os.truncate(path, 0)
try:
    for _ in batches:
        pass
except fastload.FastloadError as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("suffix", [".docs", ".bin"])
def test_a_shard_truncated_while_read_is_an_error_naming_it_not_a_sigbus(tokens: Path, tmp_path: Path, suffix: str, num_workers: int) -> None:
    """A shard's document table (memory-mapped) or token file (read by pread) cut short mid-epoch:
    a ShardError naming the file, in the training process or a worker; before, the mapped table
    killed the process (0 workers) or a worker by SIGBUS. Run in a child, so a SIGBUS fails the test."""
    shutil.copytree(tokens, tmp_path / "ds")
    proc = subprocess.run([sys.executable, "-c", TRUNCATE_MID_EPOCH, str(tmp_path / "ds"), suffix, str(num_workers)],
                          capture_output=True, text=True, timeout=240, env=cli_env())
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    (line,) = proc.stdout.splitlines()
    assert line.startswith("ShardError ") and re.search(rf"shard-\d{{5}}\{suffix}\b", line), line
    assert "cut short" in line or "holds 0 bytes" in line, line  # a table mapped before, or opened after


def test_fastload_describe_of_a_token_dataset_lists_each_rows_segments_as_the_loader_does(tokens: Path, tmp_path: Path, capsys) -> None:
    """`fastload describe` made an image loader over a token dataset and printed each document as a
    'PROBLEM no image field'; it now makes the token loader (--seq-len required, and the rows'
    options) and prints each row's segments, the ones loader.describe gives, after a saved state too."""
    from fastload.cli.command import main

    ld = loader(tokens, packing="best-fit", packing_window=2 * BLOCK)
    batches = iter(ld)
    for _ in range(7):
        next(batches)
    (tmp_path / "state.json").write_text(json.dumps(ld.state_dict()))
    common = [str(tokens), "--seq-len", str(SEQ), "--packing", "best-fit", "--block-tokens", str(BLOCK), "--packing-window", str(2 * BLOCK)]
    for step, extra in [(2, ["--seed", "3", "--batch-size", "4"]), (9, ["--state", str(tmp_path / "state.json")])]:
        assert main(["describe", *common, "--step", str(step), *extra]) == 0
        lines = capsys.readouterr().out.splitlines()
        rows = [", ".join(f"{s['shard']}:{s['document']}[{s['offset']}:{s['offset'] + s['tokens']}]" for s in row) for row in ld.describe(step)]
        assert lines[0] == f"epoch 0 step {step} rank 0 of 1, batch size 4" and lines[2:] == [f"{n:>5} {row}" for n, row in enumerate(rows)]
        assert main(["describe", *common, "--step", str(step), *extra, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["rows"] == ld.describe(step)
    assert main(["describe", str(tokens), "--step", "0"]) == 2
    err = capsys.readouterr().err
    assert "holds tokens: give --seq-len" in err and len(err.splitlines()) == 1
    assert main(["describe", *common, "--step", "0", "--balanced"]) == 2
    assert "--balanced: not options of a token dataset's loader" in capsys.readouterr().err
def documented_loss(logits: torch.Tensor, labels: torch.Tensor, world: int = 1) -> torch.Tensor:
    """The loss docs/tokens.md and examples/train_lm.py show: summed over the real labels, divided by
    the step's real labels over every rank (here given as one process's), times the ranks DDP averages over."""
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
    return loss * world / (labels != -100).sum().clamp(min=1)


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_the_last_steps_rows_are_split_evenly_over_two_ranks(tokens: Path, packing: str) -> None:
    total = len(loader(tokens, packing=packing, batch_size=1))
    batch = next(b for b in range(4, 40) if 2 <= total % (2 * b) <= b)  # the leftover rows would fill rank 0's batch alone
    left = total % (2 * batch)
    seen: Counter = Counter()
    for rank in (0, 1):
        ld = loader(tokens, packing=packing, batch_size=batch, rank=rank, world_size=2, num_workers=rank)  # rank 1 through a worker
        batches = list(ld)
        real = [int(b["attention_mask"].any(dim=1).sum()) for b in batches]
        assert len(batches) == len(ld) and real[:-1] == [batch] * (len(batches) - 1)
        assert real[-1] == (left + 1 - rank) // 2 and batches[-1]["input_ids"].shape[0] == batch  # half the leftover each; the rest padding
        assert torch.isfinite(documented_loss(torch.randn(*batches[-1]["labels"].shape, VOCAB), batches[-1]["labels"]))
        for step in range(len(batches)):
            for row in ld.describe(step):
                seen.update((s["shard"], s["document"], s["offset"] + i) for s in row for i in range(s["tokens"]))
        ld.close()
    assert seen == all_tokens(tokens)


def test_the_documented_loss_of_an_all_padding_batch_is_finite(tokens: Path) -> None:
    total = len(loader(tokens, batch_size=1))
    world = next(w for w in range(3, 20) if total % w not in (0, w - 1))  # fewer rows left than ranks: the last rank's batch is all padding
    last = list(loader(tokens, batch_size=1, rank=world - 1, world_size=world))[-1]
    labels = last["labels"]
    assert (labels == -100).all() and not last["attention_mask"].any()
    logits = torch.randn(*labels.shape, VOCAB, requires_grad=True)
    loss = documented_loss(logits, labels, world)
    loss.backward()
    assert torch.isfinite(loss) and loss == 0 and torch.isfinite(logits.grad).all()  # nothing to learn, and no NaN into the all-reduce
    assert torch.isnan(torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100))  # what the mean gave


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_a_resume_at_another_batch_size_reads_every_token_of_the_epoch_once(tokens: Path, packing: str) -> None:
    first = loader(tokens, packing=packing, batch_size=4)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = loader(tokens, packing=packing, batch_size=6, rank=1, world_size=2)  # another batch size and world size
    resumed.load_state_dict(state)
    seen: Counter = Counter()
    for rank in (0, 1):
        view = loader(tokens, packing=packing, batch_size=6, rank=rank, world_size=2)
        view.load_state_dict(state)
        steps = len(list(view)) + 5
        for step in range(steps):  # the 5 steps before the resume at their topology (one rank: rank 1 had none)
            seen.update((s["shard"], s["document"], s["offset"] + i) for row in view.describe(step, 0) for s in row for i in range(s["tokens"]))
    assert seen == all_tokens(tokens)
    assert len(list(resumed)) == steps - 5


@pytest.mark.parametrize(("changed", "named"), [({"seq_len": 2 * SEQ, "packing_window": 4 * BLOCK}, f"packing_window={8 * BLOCK} (this loader: {4 * BLOCK})"),
                                                ({"packing": "concat"}, "packing='best-fit' (this loader: 'concat')"),
                                                ({"block_tokens": 2 * BLOCK}, f"block_tokens={BLOCK} (this loader: {2 * BLOCK})"),
                                                ({"packing_window": 4 * BLOCK}, f"packing_window={8 * BLOCK} (this loader: {4 * BLOCK})")])
def test_a_resume_with_rows_cut_another_way_names_what_changed(tokens: Path, changed: dict, named: str) -> None:
    first = loader(tokens, packing="best-fit", packing_window=8 * BLOCK)
    it = iter(first)
    next(it)
    state = first.state_dict()
    other = loader(tokens, **{"packing": "best-fit", "packing_window": 8 * BLOCK, **changed})
    with pytest.raises(ValueError, match=re.escape(f"state was saved with {named}: its 4 rows consumed of epoch 0")) as error:
        other.load_state_dict(state)
    assert "Resume with the saved values" in str(error.value) and "\n" not in str(error.value)
    loader(tokens, packing="best-fit", packing_window=8 * BLOCK + 1).load_state_dict(state)  # the same window of whole blocks: the same rows


def member_of(segment: dict, first: Path) -> int:
    """Which member of a two-member mixture a described segment is of (0: the one at ``first``)."""
    return 0 if segment["shard"].startswith(f"{first}/") else 1


def test_a_mixture_by_tokens_delivers_each_members_share_of_the_tokens(tokens: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    """Weights 0.3 and 0.7: of the tokens an epoch's batches hold, 30% are the first member's (not 70%)."""
    mixture = fastload.mix({str(tokens): 0.3, str(token_member(tokenizer_file, tmp_path)): 0.7}, by="tokens")
    ld = fastload.DataLoader(mixture, batch_size=8, seq_len=SEQ, block_tokens=BLOCK)
    held = [0, 0]
    for step, batch in enumerate(ld):
        for used, segments in zip(batch["attention_mask"].sum(dim=1).tolist(), ld.describe(step, 0)):
            if used:
                owners = {member_of(s, tokens) for s in segments}
                assert len(owners) == 1 and sum(s["tokens"] for s in segments) == used  # a row is one member's
                held[owners.pop()] += used
    assert sum(held) > 100_000 and abs(held[0] / sum(held) - 0.3) <= 0.01, held


def test_a_mixture_by_tokens_draws_a_new_stream_of_a_member_each_time_it_comes_round(tokens: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    """The second member (66K tokens, weight 0.7 of epochs of about 200K) goes round about twice an
    epoch, on from epoch to epoch: each round holds each of its token positions once, in an order of
    its own."""
    second = token_member(tokenizer_file, tmp_path)
    mixture = fastload.mix({str(tokens): 0.3, str(second): 0.7}, by="tokens")
    ld = fastload.DataLoader(mixture, batch_size=8, seq_len=SEQ, block_tokens=BLOCK)
    everything = set(every_position(second))  # (shard file, document, offset)
    order = [(s["shard"].rsplit("/", 1)[1], s["document"], s["offset"] + i) for epoch in range(2) for step in range(len(ld))
             for row in ld.describe(step, epoch) for s in row if member_of(s, tokens) == 1 for i in range(s["tokens"])]
    size = len(everything)
    rounds = [order[at : at + size] for at in range(0, len(order) - size + 1, size)]
    assert len(rounds) >= 4
    assert all(set(r) == everything for r in rounds)  # each round: every position once
    assert all(a != b for a, b in itertools.pairwise(rounds)), "a member's round repeats the one before"


@pytest.mark.parametrize("mixed", [False, True])
def test_two_ranks_deliver_different_rows_that_together_are_the_epochs(tokens: Path, tokenizer_file: Path, tmp_path: Path, mixed: bool) -> None:
    """Checked on the batches each rank's loader delivers: no row on both ranks, and the two ranks'
    rows are the rows one rank delivers (each rank a loader of its own, as each process of a job has)."""
    data = fastload.mix({str(tokens): 0.3, str(token_member(tokenizer_file, tmp_path)): 0.7}, by="tokens") if mixed else fastload.open(tokens)

    def rows(**kwargs: int) -> Counter:
        delivered: Counter = Counter()
        for batch in fastload.DataLoader(data, batch_size=4, seq_len=SEQ, block_tokens=BLOCK, seed=3, **kwargs):
            delivered.update(tuple(row[mask.bool()].tolist()) for row, mask in zip(batch["input_ids"], batch["attention_mask"]) if mask.any())
        return delivered

    ranks = [rows(rank=r, world_size=2) for r in range(2)]
    assert not set(ranks[0]) & set(ranks[1])
    assert ranks[0] + ranks[1] == rows()


def rows_of_ranks(make: Callable[[int], fastload.TokenDataLoader], world: int, state: dict | None = None,
                  steps: int | None = None) -> tuple[Counter, dict]:
    """The rows (their real tokens) the ``world`` ranks' loaders ``make(rank)`` deliver in an epoch,
    each resumed from ``state`` if given, and with ``steps`` stopping there: the state saved then."""
    delivered: Counter = Counter()
    saved: dict = {}
    for rank in range(world):
        ld = make(rank)
        if state is not None:
            ld.load_state_dict(state)
        for step, batch in enumerate(ld, start=1):
            delivered.update(tuple(row[mask.bool()].tolist()) for row, mask in zip(batch["input_ids"], batch["attention_mask"]) if mask.any())
            if step == steps:
                saved = ld.state_dict()
                break
    return delivered, saved


@pytest.mark.parametrize("world_after", [2, 3])
def test_a_resume_of_two_ranks_counts_the_global_step(tokens: Path, world_after: int) -> None:
    """Two ranks save after 5 steps (5 x 2 x 4 rows consumed, not 5 x 4); resumed at 2 or 3 ranks, the
    rows before and after are the epoch's rows once each."""
    def ranks(world: int, state: dict | None = None, steps: int | None = None) -> tuple[Counter, dict]:
        return rows_of_ranks(lambda rank: loader(tokens, batch_size=4, rank=rank, world_size=world), world, state, steps)

    before, state = ranks(2, steps=5)
    assert state["samples_consumed"] == 5 * 2 * 4
    after, _ = ranks(world_after, state=state)
    assert before + after == ranks(1)[0]


def test_the_sampler_and_batch_sampler_step_by_the_global_batch(tokens: Path) -> None:
    """Rank 1 of 2: ``loader.batch_sampler`` yields the rows of its batches (rows 4-7, 12-15, ... of
    global steps of 8), as many as the loader's; a torch DataLoader made of the loader's parts yields
    the loader's very batches; ``loader.sampler`` yields the same rows one by one."""
    ranks = [loader(tokens, batch_size=4, rank=r, world_size=2) for r in range(2)]
    one = ranks[1]
    batches = [list(b) for b in one.batch_sampler]
    assert len(batches) == len(one) == len(ranks[0].batch_sampler)
    assert batches[:3] == [list(range(8 * k + 4, 8 * k + 8)) for k in range(3)]
    assert list(one.sampler) == [row for b in batches for row in b]
    assert not set(ranks[0].sampler) & set(one.sampler)
    parts = torch.utils.data.DataLoader(one.dataset, batch_sampler=one.batch_sampler, collate_fn=one.collate_fn)
    for made, own in zip(parts, one):
        assert torch.equal(made["input_ids"], own["input_ids"]) and torch.equal(made["labels"], own["labels"])


def seq_len_resumes(tokens: Path, packing: str, lengths: list[int], worlds: list[int], num_workers: int, **kwargs: object) -> tuple[list, list, dict, int]:
    """Train at ``lengths[0]`` on ``worlds[0]`` ranks, saving a state after 5 steps at each length and resuming it at the
    next (on ``worlds[n]`` ranks; the last run to the epoch's end, with ``num_workers``): every batch delivered (rank, step, batch, seq_len),
    each rank's last loader (which ran the epoch's end), the state it was resumed from and the step it resumed at."""
    delivered: list = []
    state: dict | None = None
    step, last, resumed_at = 0, [], 0
    for n, (seq_len, world) in enumerate(zip(lengths, worlds, strict=True)):
        if n:
            state, resumed_at = json.loads(json.dumps(last[0].state_dict())), step
        last = []
        for rank in range(world):
            ld = loader(tokens, packing=packing, seq_len=seq_len, rank=rank, world_size=world, num_workers=num_workers if n else 0, **kwargs)
            if state is not None:
                ld.load_state_dict(state)
            batches = list(itertools.islice(ld, 5)) if n < len(lengths) - 1 else list(ld)
            delivered += [(rank, step + k, b, seq_len) for k, b in enumerate(batches)]
            last.append(ld)
        step += len(batches)
    assert state is not None
    return delivered, last, state, resumed_at


@pytest.mark.parametrize("packing", ["concat", "pad", "best-fit"])
@pytest.mark.parametrize(("lengths", "worlds", "num_workers"), [([64, 128], [1, 1], 0), ([128, 64], [2, 2], 2), ([64, 128, 96], [2, 1, 2], 0),
                                                              ([64, 128, 64], [1, 2, 2], 2)])
def test_a_resume_at_another_seq_len_delivers_every_token_of_the_epoch_once(tokens: Path, packing: str, lengths: list[int], worlds: list[int],
                                                                            num_workers: int) -> None:
    """Short-to-long warm-up: a state saved at one seq_len resumes at another (twice over, 64 -> 128 -> 96 or back to 64):
    concat goes on from the stream's token the rows delivered so far ended at, pad from the next document, best-fit
    from the pieces of the saved window its rows did not hold, packed anew (windows of one block here, so the resumes
    fall in the first and later windows), so over the ranks the epoch delivers each token (pad: each document, as much
    as the seq_len that delivered it takes) once; ``describe`` names every step as it was delivered, before and after
    the resumes; the batch sampler makes the same batches; the next epoch runs at the new seq_len whole; the world
    size may change too. Before: refused ("state was saved with seq_len=..."; best-fit: "best-fit packs whole windows")."""
    kwargs = {"packing_window": BLOCK} if packing == "best-fit" else {}
    delivered, last, state, resumed_at = seq_len_resumes(tokens, packing, lengths, worlds, num_workers, **kwargs)
    world = worlds[-1]
    for rank, step, batch, seq_len in delivered:
        assert batch["input_ids"].shape == (4, seq_len)
        assert_batch_is_what_describe_names(last[rank], batch, step, 0)
    steps = range(1 + max(step for _, step, _, _ in delivered))
    rows = [(rank, step, row) for rank, ld in enumerate(last) for step in steps for row in ld.describe(step, 0) if row]
    if packing != "pad":  # every token once; and the tokens themselves, counted from the batches
        assert Counter((s["shard"], s["document"], s["offset"] + i) for _, _, row in rows for s in row for i in range(s["tokens"])) == all_tokens(tokens)
        ds = fastload.open(tokens)
        every = Counter(t for shard in range(len(ds.index.shards)) for d in range(len(ds.reader(shard)))
                        for t in ds.reader(shard).document(d).tolist())
        assert sum((Counter(b["input_ids"][b["attention_mask"] == 1].tolist()) for _, _, b, _ in delivered), Counter()) == every
    else:  # each document once, its first tokens as many as the seq_len of the step that delivered it
        documents = Counter({(shard, doc) for shard, doc, _ in all_tokens(tokens)})
        assert Counter((row[0]["shard"], row[0]["document"]) for _, _, row in rows) == documents
        seq_len_at = {(rank, step): seq_len for rank, step, _, seq_len in delivered}
        ds = fastload.open(tokens)
        shard_of = {info.path: n for n, info in enumerate(ds.index.shards)}
        for rank, step, [segment] in rows:
            start, end = ds.reader(shard_of[segment["shard"]]).bounds(segment["document"])
            assert segment["offset"] == 0 and segment["tokens"] == min(end - start, seq_len_at[(rank, step)])
    for rank in range(world):  # the batch sampler of a loader resumed as the last one was: the same batches
        view = loader(tokens, packing=packing, seq_len=lengths[-1], rank=rank, world_size=world, **kwargs)
        view.load_state_dict(state)
        made = [b.fill(view.dataset)["input_ids"] for b in view.batch_sampler]
        assert len(made) == len(list(b for r, step, b, _ in delivered if r == rank and step >= resumed_at))
        for got, (_, _, batch, _) in zip(made, [d for d in delivered if d[0] == rank and d[1] >= resumed_at], strict=True):
            assert torch.equal(got, batch["input_ids"])
    for rank, ld in enumerate(last):  # the next epoch: whole at the last seq_len
        fresh = loader(tokens, packing=packing, seq_len=lengths[-1], rank=rank, world_size=world, **kwargs)
        fresh.set_epoch(1)
        assert len(ld) == len(fresh)
        for ours, theirs in zip(ld, fresh, strict=True):
            assert torch.equal(ours["input_ids"], theirs["input_ids"]) and torch.equal(ours["labels"], theirs["labels"])


def test_a_resume_at_another_seq_len_of_a_mixture_or_another_packing_is_refused_saying_why(tokens: Path, tokenizer_file: Path,
                                                                                            tmp_path: Path) -> None:
    """A mixture's member schedule counts its rows: a resume at another seq_len is refused naming seq_len, why, and what
    to do; best-fit saved, concat resumed at another seq_len: both named at once; a saved seq_len no loader has is named."""
    data = fastload.mix({str(tokens): 0.3, str(token_member(tokenizer_file, tmp_path)): 0.7}, by="tokens")
    first = loader(data)
    next(iter(first))
    state = json.loads(json.dumps(first.state_dict()))
    with pytest.raises(ValueError, match=re.escape(f"state was saved with seq_len={SEQ} (this loader: {2 * SEQ})")) as error:
        loader(data, seq_len=2 * SEQ).load_state_dict(state)
    assert "a mixture by tokens deals its members" in str(error.value) and "only rows of one dataset, with the packing they were saved with" in str(error.value)
    best_fit = loader(tokens, packing="best-fit")
    next(iter(best_fit))
    state = json.loads(json.dumps(best_fit.state_dict()))
    with pytest.raises(ValueError, match=re.escape(f"seq_len={SEQ} (this loader: {2 * SEQ}), packing='best-fit' (this loader: 'concat')")):
        loader(tokens, seq_len=2 * SEQ).load_state_dict(state)
    with pytest.raises(ValueError, match=re.escape("loader state: rows.seq_len=0 is less than 1")):
        loader(tokens, seq_len=2 * SEQ).load_state_dict({**state, "rows": {**state["rows"], "seq_len": 0, "packing": "concat"}})


def test_a_best_fit_state_resumed_at_another_seq_len_checks_the_window_it_names_and_resumes_at_the_epochs_end(tokens: Path) -> None:
    """The window a best-fit resume at another seq_len records in its ``resumed_from`` entry must hold that entry's row
    (else a one-line error naming it); an entry for the same seq_len names none; a state saved at the epoch's end (no
    packing_cursor) resumes at another seq_len with nothing left, but one without a packing_cursor mid-epoch is refused."""
    first = loader(tokens, packing="best-fit", seq_len=64, packing_window=BLOCK)
    list(itertools.islice(first, 20))  # 80 rows: past the first window's
    resumed = loader(tokens, packing="best-fit", packing_window=BLOCK)
    resumed.load_state_dict(first.state_dict())
    state = json.loads(json.dumps(resumed.state_dict()))
    [entry] = state["resumed_from"]
    assert entry[:4] == [1, 4, 80, 64] and entry[4] >= 1 and entry[5] <= 80 and state["packing_cursor"] == [entry[4], 80]
    for window, first_row in ((entry[4] + 5, entry[5]), (entry[4], 81)):  # a window 5 further cannot start so early; none starts past its row
        with pytest.raises(ValueError, match=re.escape(f"loader state: resumed_from's entry at samples_consumed=80 (seq_len=64) names best-fit "
                                                       f"window {window} from row {first_row}, which cannot hold that row")):
            loader(tokens, packing="best-fit", packing_window=BLOCK).load_state_dict({**state, "resumed_from": [[1, 4, 80, 64, window, first_row]]})
    with pytest.raises(ValueError, match=re.escape("resumed_from holds [1, 4, 80, 128, 1, 0], which names a window, but the seq_len after it is the same")):
        loader(tokens, packing="best-fit", packing_window=BLOCK).load_state_dict({**state, "resumed_from": [[1, 4, 80, 128, 1, 0]]})
    mid = {**first.state_dict()}
    del mid["packing_cursor"]
    with pytest.raises(ValueError, match=re.escape("resumed_from's entry at samples_consumed=80 (seq_len=64) names no best-fit window, but epoch 0 "
                                                   "holds")):
        loader(tokens, packing="best-fit", packing_window=BLOCK).load_state_dict(mid)
    done = loader(tokens, packing="best-fit", seq_len=64, packing_window=BLOCK)
    list(done)
    ended = loader(tokens, packing="best-fit", seq_len=64, packing_window=BLOCK)
    ended.load_state_dict(done.state_dict())
    ended.set_epoch(0)  # a state saved after the epoch's last batch, set to that epoch again: at its end
    at_end = ended.state_dict()
    assert at_end["epoch"] == 0 and at_end["samples_consumed"] > 80 and "packing_cursor" not in at_end
    later = loader(tokens, packing="best-fit", packing_window=BLOCK)
    later.load_state_dict(at_end)
    assert list(later) == [] and later.state_dict()["epoch"] == 1


def test_the_seq_len_of_a_token_states_resumed_from_entry_is_checked_and_an_image_state_has_none(tokens: Path, clean: Path) -> None:
    """A token state's ``resumed_from`` entries carry the seq_len their rows were cut at (a triple, from before:
    the saved seq_len's); one below 1 is named. An image state's entries stay triples."""
    first = loader(tokens, seq_len=64)
    next(iter(first))
    resumed = loader(tokens)
    resumed.load_state_dict(first.state_dict())
    state = resumed.state_dict()
    assert state["resumed_from"] == [[1, 4, 4, 64]] and state["rows"]["seq_len"] == SEQ
    with pytest.raises(ValueError, match=re.escape("loader state: resumed_from[0].seq_len=0 is less than 1")):
        loader(tokens).load_state_dict({**state, "resumed_from": [[1, 4, 4, 0]]})
    images = fastload.DataLoader(clean, batch_size=4, transform=fastload.transforms.val(16))
    next(iter(images))
    with pytest.raises(ValueError, match=re.escape("resumed_from holds [1, 4, 4, 64], not a (world_size, batch_size, samples_consumed) triple")):
        fastload.DataLoader(clean, batch_size=4, transform=fastload.transforms.val(16)).load_state_dict(
            {**images.state_dict(), "resumed_from": [[1, 4, 4, 64]]})

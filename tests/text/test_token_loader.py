"""The token loader: rows for each packing mode, labels and positions, every token of an epoch
exactly once over the ranks, exact and elastic resume (real gloo ranks, saved with 4 and resumed
with 3), best-fit's padding against an offline best-fit decreasing, mixing by tokens, describe, stats."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fastload
from fastload.converters import ConvertOptions, convert
from fastload.converters.options import TokenizeOptions
from fastload.loading.token_rows import BestFitRows, TokenCorpus
from fastload.text.packing import best_fit_decreasing, padding_fraction, split_long
from tests.text.conftest import real_paragraphs, write_jsonl

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


def loader(path: Path, **kwargs) -> fastload.TokenDataLoader:
    return fastload.DataLoader(str(path), **{"batch_size": 4, "seq_len": SEQ, "block_tokens": BLOCK, "seed": 3, **kwargs})


def covered(ld, epoch: int, steps: int, world: int) -> Counter:
    """Every (shard, document, token offset) the rows of ``steps`` global steps hold, over all ranks, counted."""
    seen: Counter = Counter()
    for rank in range(world):
        view = loader(ld.dataset.root, rank=rank, world_size=world, packing=ld.tokens.packing.value)
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


def test_batches_hold_the_tokens_describe_names_with_labels_and_positions(tokens: Path) -> None:
    ld = loader(tokens, packing="best-fit")
    ds = fastload.open(tokens)
    batch = next(iter(ld))
    assert batch["input_ids"].shape == (4, SEQ) and batch["input_ids"].dtype == torch.int64
    for r, row in enumerate(ld.describe(0, 0)):
        column = 0
        for s in row:
            shard = next(n for n, info in enumerate(ds.index.shards) if info.path == s["shard"])
            doc = ds.reader(shard).document(s["document"])
            piece = doc[s["offset"] : s["offset"] + s["tokens"]]
            assert batch["input_ids"][r, column : column + s["tokens"]].tolist() == piece.tolist()
            assert batch["position_ids"][r, column : column + s["tokens"]].tolist() == list(range(s["tokens"]))
            expected = doc[s["offset"] + 1 : s["offset"] + s["tokens"] + 1].tolist()
            expected += [-100] * (s["tokens"] - len(expected))  # the document's last token: nothing to predict
            assert batch["labels"][r, column : column + s["tokens"]].tolist() == expected
            column += s["tokens"]
        assert batch["attention_mask"][r].sum() == column and (batch["labels"][r, column:] == -100).all()
    bounds = batch["cu_seqlens"].tolist()
    assert bounds[0] == 0 and bounds[-1] == 4 * SEQ and bounds == sorted(bounds) and batch["max_seqlen"] <= SEQ


def test_concat_rows_are_full_and_pad_rows_one_document_each(tokens: Path) -> None:
    concat = loader(tokens, packing="concat")
    masks = [b["attention_mask"] for b in concat]
    assert all(m.all() for m in masks[:-1])  # no padding but in the epoch's last row
    pad = loader(tokens, packing="pad", batch_size=8)
    docs = fastload.open(tokens).index.num_samples
    assert len(pad) == -(-docs // 8)
    rows = [len(row) for step in range(len(pad)) for row in pad.describe(step)]
    assert rows.count(1) == docs and set(rows) <= {0, 1}


def test_best_fit_padding_is_the_offline_best_fit_decreasing_of_each_block(tokens: Path) -> None:
    ld = loader(tokens, packing="best-fit")
    rows = BestFitRows(TokenCorpus(fastload.open(tokens)), SEQ, BLOCK, 3, 0, True)
    packed = 0
    for index in range(rows.stream.stream.blocks):
        starts, lengths, _, _ = rows.stream.block(index)
        parts = split_long(starts, lengths, SEQ)[1]
        offline = best_fit_decreasing(np.sort(parts)[::-1], SEQ)
        assert len(rows.block_rows(index)) == len(offline)
        packed += len(offline)
    total = fastload.open(tokens).index.num_tokens
    assert len(ld) == -(-packed // 4)
    assert 1 - total / (packed * SEQ) < 0.05  # a few percent of padding (Grain's packers side by side: benchmarks/bench_tokens.py)
    assert padding_fraction([[0]], np.array([SEQ // 2]), SEQ) == 0.5


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


def _rank_main(rank: int, world: int, init: str, path: str, out: str, kwargs: dict, state: dict | None, stop_after: int | None) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    ld = fastload.DataLoader(path, **kwargs)
    if state is not None:
        ld.load_state_dict(state)
    spans, batches, saved = [], 0, None
    for batch in ld:
        step = torch.ones(1)
        dist.all_reduce(step)  # a collective a step, as DDP: hangs if the ranks' step counts differ
        spans.append(batch["input_ids"][batch["attention_mask"].bool()].tolist())
        batches += 1
        if stop_after is not None and batches == stop_after:
            saved = ld.state_dict()
            break
    Path(out, f"rank{rank}.json").write_text(json.dumps({"tokens": spans, "batches": batches, "state": saved}))
    ld.close()
    dist.barrier()
    dist.destroy_process_group()


def run_ranks(tmp_path: Path, world: int, path: Path, kwargs: dict, state: dict | None = None, stop_after: int | None = None) -> list[dict]:
    out = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    out.mkdir()
    mp.spawn(_rank_main, args=(world, str(out / "init"), str(path), str(out), kwargs, state, stop_after), nprocs=world, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_saved_with_4_gloo_ranks_resumed_with_3_every_token_once(tokens: Path, tmp_path: Path, packing: str) -> None:
    kwargs = {"batch_size": 2, "seq_len": SEQ, "packing": packing, "block_tokens": BLOCK, "seed": 5}
    first = run_ranks(tmp_path, 4, tokens, kwargs, stop_after=6)
    assert len({r["batches"] for r in first}) == 1
    second = run_ranks(tmp_path, 3, tokens, kwargs, state=first[0]["state"])
    assert len({r["batches"] for r in second}) == 1  # every rank the same number of steps
    delivered = Counter(t for r in first + second for batch in r["tokens"] for t in batch)
    ds = fastload.open(tokens)
    expected = Counter(int(t) for n in range(len(ds.index.shards)) for t in ds.reader(n).read_tokens(0, ds.index.shards[n].tokens))
    assert delivered == expected  # every token of the epoch exactly once (as ids: their multiset)


def test_mixing_by_tokens_gives_each_its_share_evenly_and_resumes(tokens: Path, tokenizer_file: Path, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "b.jsonl", real_paragraphs()[::-1][:800])
    convert(str(tmp_path / "b.jsonl"), str(tmp_path / "b"), ConvertOptions(
        source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer_file), shard_tokens=20_000)), quiet=True)
    mixture = fastload.mix({str(tokens): 0.3, str(tmp_path / "b"): 0.7}, by="tokens")
    ld = fastload.DataLoader(mixture, batch_size=8, seq_len=SEQ, block_tokens=BLOCK)
    members = []
    for step in range(len(ld)):
        for row in ld.describe(step):
            members.append(0 if row and row[0]["shard"].startswith(str(tokens)) else 1)
    first_member = np.asarray(members) == 0
    prefix = np.cumsum(first_member) - 0.3 * np.arange(1, len(members) + 1)
    assert np.abs(prefix).max() <= 1  # after any number of rows, within a row of 30%: +-0.5 pp over any 200 rows
    window = 200
    counts = np.convolve(first_member, np.ones(window), "valid")
    assert np.abs(counts / window - 0.3).max() <= 0.01
    first = fastload.DataLoader(mixture, batch_size=8, seq_len=SEQ, block_tokens=BLOCK)
    it = iter(first)
    for _ in range(6):
        next(it)
    state = first.state_dict()
    again = fastload.DataLoader(mixture, batch_size=8, seq_len=SEQ, block_tokens=BLOCK)
    again.load_state_dict(state)
    assert torch.equal(next(iter(again))["input_ids"], next(iter(loader_from(mixture, 6))))


def loader_from(mixture, skip: int):
    ld = fastload.DataLoader(mixture, batch_size=8, seq_len=SEQ, block_tokens=BLOCK)
    it = iter(ld)
    for _ in range(skip):
        next(it)
    return (b["input_ids"] for b in it)


def test_stats_count_tokens_and_seq_len_needs_a_token_dataset(tokens: Path) -> None:
    ld = loader(tokens)
    for _ in ld:
        pass
    assert ld.stats.tokens == fastload.open(tokens).index.num_tokens and ld.stats.epochs[0].complete
    with pytest.raises(ValueError, match="seq_len must be a positive number of tokens"):
        fastload.TokenDataLoader(fastload.open(tokens), seq_len=0)

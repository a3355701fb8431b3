"""What ``fastload inspect`` shows: the index plus the skipped-sample report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from fastload.formats.index import SKIPPED_REPORT, VIDEO_FORMAT_VERSION, DatasetIndex, read_index
from fastload.formats.shard_files import open_shard
from fastload.formats.tokens.reader import TokenShardReader
from fastload.storage import remote
from fastload.storage.dataset import read_remote_index


def summarize(root: str | Path, clip_span: int = 31) -> dict:
    """A JSON-ready summary of a converted dataset (a folder or a URL): sizes, fields, classes,
    skipped samples; videos' decoding cost for clips covering ``clip_span`` frames (16 of stride 2)."""
    from fastload.storage.in_place_index import locate

    if locate(root) is not None:  # data read in place, never indexed beside it: its index as the loader makes it
        from fastload.storage.dataset import ShardedDataset

        index, report_name, report_bytes = ShardedDataset(root).index, "", b""
    elif remote.is_url(str(root)):
        url = str(root)
        index = read_remote_index(url)
        report_name = remote.redact(remote.join(url, SKIPPED_REPORT))
        report_bytes = remote.read_if_exists(remote.join(url, SKIPPED_REPORT)) or b""
    else:
        index = read_index(root)
        report = Path(root) / SKIPPED_REPORT
        report_name, report_bytes = str(report), report.read_bytes() if report.exists() else b""
    skipped_samples = read_skipped_report(report_bytes, report_name)
    tokens = None
    if index.tokenizer is not None:
        tokens = {"tokens": index.num_tokens, "tokenizer": dict(vars(index.tokenizer))}
        if not remote.is_url(str(root)):  # the histograms read the shards
            tokens.update(token_histograms(Path(root), index))
    return {
        "tokens": tokens,
        "layout": index.layout,
        "source": index.source,
        "samples": index.num_samples,
        "shards": len(index.shards),
        "bytes": index.total_bytes,
        "fields": list(index.fields),
        "decoded_shape": list(index.decoded_shape) if index.decoded_shape else None,
        "classes": list(index.classes) if index.classes is not None else None,
        "class_counts": index.class_counts,
        "class_balance": class_balance(index.class_counts, index.classes),
        "skipped": index.skipped,
        "skipped_total": sum(index.skipped.values()),
        "skipped_samples": skipped_samples,
        "duplicates": index.duplicates,
        **media_summary(root, clip_span, index.version == VIDEO_FORMAT_VERSION),
    }


def media_summary(root: str | Path, clip_span: int, streams: bool) -> dict:
    """Each media role's part of the summary (fastload.media: "videos", "audio"), summed up from the
    stream facts in the sample tables (nothing is opened); each None for a dataset without ``streams``
    (an index before version 2)."""
    from fastload.media import MEDIA_ROLES

    if not streams:
        return {media.summary_key: None for media in MEDIA_ROLES.values()}
    from fastload.storage.dataset import ShardedDataset

    ds = ShardedDataset(root)
    facts = [facts for i in range(len(ds)) for facts in ds.stream_facts(i).values()]
    ds.close()
    return {media.summary_key: media.summarize(facts, clip_span) for media in MEDIA_ROLES.values()}


def read_skipped_report(data: bytes, where: str) -> list[dict[str, str]]:
    """The entries of a ``skipped.jsonl`` (one JSON object with ``where`` and ``reason`` strings a
    line); a line that is not one is a ValueError naming ``where`` and the line."""
    entries = []
    for number, line in enumerate(data.splitlines(), 1):
        try:
            entry = json.loads(line)
        except ValueError:  # bad JSON or UTF-8
            entry = None
        if not (isinstance(entry, dict) and isinstance(entry.get("where"), str) and isinstance(entry.get("reason"), str)):
            raise ValueError(f"{where}: line {number} is not a skipped-sample entry (a JSON object with 'where' and 'reason' strings)")
        entries.append(entry)
    return entries


def class_balance(counts: dict[str, int], classes: tuple[str, ...] | None = None) -> dict | None:
    """How unbalanced the classes are: the largest class over the smallest (None when a class of
    ``classes`` has no sample), and the entropy of the class shares in bits, also as a share of
    its maximum log2(classes) (1.0: perfectly balanced). None without classes."""
    full = {name: counts.get(name, 0) for name in classes} if classes is not None else dict(counts)
    full.update(counts)
    total = sum(full.values())
    if not full or total == 0:
        return None
    largest, smallest = max(full.values()), min(full.values())
    entropy = sum(c / total * math.log2(total / c) for c in full.values() if c)
    return {
        "classes": len(full),
        "largest": largest,
        "smallest": smallest,
        "max_min_ratio": largest / smallest if smallest else None,
        "entropy_bits": entropy,
        "normalized_entropy": entropy / math.log2(len(full)) if len(full) > 1 else 1.0,
    }


LENGTH_BINS = 24  # document lengths in powers of two: 1, 2-3, 4-7, ... up to 2**23 and more
SAMPLED_TOKENS = 1 << 22  # token ids counted for the histogram of ids: spread over the shards
TOP_IDS = 20


def token_histograms(root: Path, index: DatasetIndex) -> dict:
    """A token dataset's document lengths in powers of two (every document, from the document
    tables), their mean and quantiles, and its most frequent token ids (among SAMPLED_TOKENS
    read evenly from its shards)."""
    bins = np.zeros(LENGTH_BINS, dtype=np.int64)
    ids: np.ndarray = np.zeros(0, dtype=np.int64)
    lengths_seen: list[np.ndarray] = []
    per_shard = max(1, SAMPLED_TOKENS // max(len(index.shards), 1))
    for shard in index.shards:
        reader = open_shard(root, index, shard)
        assert isinstance(reader, TokenShardReader)
        try:
            lengths = np.diff(reader.checked_offsets(0, len(reader)))
            bins += np.bincount(np.minimum(np.log2(np.maximum(lengths, 1)).astype(np.int64), LENGTH_BINS - 1), minlength=LENGTH_BINS)
            lengths_seen.append(lengths[:: max(1, len(lengths) // 4096)])  # a spread of them, for the quantiles
            count = min(per_shard, reader.tokens)
            ids = np.concatenate([ids, reader.read_tokens(0, count).astype(np.int64)])
        finally:
            reader.close()
    sample = np.concatenate(lengths_seen) if lengths_seen else np.zeros(1, dtype=np.int64)
    counts = np.bincount(ids) if len(ids) else np.zeros(0, dtype=np.int64)
    top = np.argsort(-counts, kind="stable")[:TOP_IDS]
    return {
        "length_histogram": {f"{2**b}-{2 ** (b + 1) - 1}" if b < LENGTH_BINS - 1 else f"{2**b}+": int(n)
                             for b, n in enumerate(bins.tolist()) if n},
        "mean_length": index.num_tokens / max(index.num_samples, 1),
        "length_quantiles": {f"p{q}": int(np.percentile(sample, q)) for q in (50, 90, 99)},
        "top_ids": [{"id": int(i), "share": float(counts[i] / max(len(ids), 1))} for i in top.tolist() if counts[i]],
        "ids_sampled": len(ids),
    }

"""What ``fastload inspect`` shows: the index plus the skipped-sample report."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

from fastload.formats.index import SKIPPED_REPORT, VIDEO_FORMAT_VERSION, read_index
from fastload.storage import remote
from fastload.storage.dataset import read_remote_index


def summarize(root: str | Path) -> dict:
    """A JSON-ready summary of a converted dataset (a folder or a URL): sizes, fields, classes,
    skipped samples."""
    if remote.is_url(str(root)):
        url = str(root)
        index = read_remote_index(url)
        report_name = remote.redact(remote.join(url, SKIPPED_REPORT))
        report_bytes = remote.read_if_exists(remote.join(url, SKIPPED_REPORT)) or b""
    else:
        index = read_index(root)
        report = Path(root) / SKIPPED_REPORT
        report_name, report_bytes = str(report), report.read_bytes() if report.exists() else b""
    skipped_samples = read_skipped_report(report_bytes, report_name)
    return {
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
        "videos": video_summary(root) if index.version == VIDEO_FORMAT_VERSION else None,
    }


def video_summary(root: str | Path) -> dict:
    """The videos' stream facts over the dataset, from its sample tables (no video is opened):
    how many, their codecs, frames, seconds, sizes, keyframe spacing and audio."""
    from fastload.storage.dataset import ShardedDataset

    ds = ShardedDataset(root)
    codecs: Counter[str] = Counter()
    frames: list[int] = []
    gaps: list[float] = []
    sides: list[tuple[int, int]] = []
    seconds, audio = 0.0, 0
    for i in range(len(ds)):
        for facts in ds.stream_facts(i).values():
            codecs[facts.codec] += 1
            frames.append(facts.frames)
            seconds += facts.seconds
            gaps.append(facts.frames / len(facts.keyframes))
            sides.append((facts.width, facts.height))
            audio += facts.audio_rate > 0
    ds.close()
    if not frames:
        return {"count": 0}
    smallest, largest = min(sides, key=_area), max(sides, key=_area)
    return {
        "count": len(frames), "codecs": dict(codecs.most_common()), "frames_min": min(frames), "frames_max": max(frames),
        "seconds": round(seconds, 1), "mean_frames_per_keyframe": round(sum(gaps) / len(gaps), 1),
        "smallest": [*smallest], "largest": [*largest],
        "with_audio": audio,
    }


def _area(side: tuple[int, int]) -> int:
    return side[0] * side[1]


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

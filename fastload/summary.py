"""What ``fastload inspect`` shows: the index plus the skipped-sample report."""

from __future__ import annotations

import json
from pathlib import Path

from fastload.index import SKIPPED_REPORT, read_index


def summarize(root: str | Path) -> dict:
    """A JSON-ready summary of a converted dataset: sizes, fields, classes, skipped samples."""
    root = Path(root)
    index = read_index(root)
    report = root / SKIPPED_REPORT
    skipped_samples = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
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
        "skipped": index.skipped,
        "skipped_total": sum(index.skipped.values()),
        "skipped_samples": skipped_samples,
        "duplicates": index.duplicates,
    }

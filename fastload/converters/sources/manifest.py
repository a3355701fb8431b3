"""A CSV or JSONL manifest listing image paths (relative to the manifest) and labels."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from fastload.converters.sample import Sample, SourceItem, file_stamp, make_key, unique_keys
from fastload.converters.sources import SourceOptions
from fastload.errors import SampleError


@dataclass(frozen=True)
class ManifestSource:
    """Rows of (path, label); string labels become class indices in sorted order."""

    base: Path
    rows: tuple[tuple[str, int | None], ...]
    classes: tuple[str, ...] | None
    manifest: Path

    def items(self) -> list[SourceItem]:
        """One item per manifest row, in file order."""
        keys = unique_keys([make_key(path) for path, _ in self.rows])
        out = []
        listed = file_stamp(self.manifest)  # the labels come from it
        for lineno, (key, (path, label)) in enumerate(zip(keys, self.rows), start=1):
            full = self.base / path
            try:
                stamp = file_stamp(full)
            except OSError:
                stamp = ()
            where = f"{full} (row {lineno} of {self.manifest.name})"
            out.append(SourceItem(key=key, where=where, size_hint=stamp[0] if stamp else 0, ref=(path, label), stamp=listed + stamp))
        return out

    def load(self, item: SourceItem) -> Sample:
        """Read the listed file's bytes."""
        path, label = item.ref
        try:
            data = (self.base / path).read_bytes()
        except OSError as exc:
            raise SampleError(item.where, f"unreadable: {exc.strerror or exc}") from None
        return Sample(key=item.key, where=item.where, image=data, label=label)


def _read_rows(manifest: Path) -> list[dict]:
    if manifest.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        rows = []
        for lineno, line in enumerate(manifest.read_text().splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{manifest}:{lineno}: invalid JSON ({exc.msg})") from None
        return rows
    with open(manifest, newline="") as f:
        dialect = "excel-tab" if manifest.suffix.lower() == ".tsv" else "excel"
        return list(csv.DictReader(f, dialect=dialect))


def _as_int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def open_source(path: str, options: SourceOptions) -> ManifestSource:
    """Read the whole manifest (it is small) and resolve labels to class indices."""
    manifest = Path(path)
    rows = _read_rows(manifest)
    if not rows:
        raise ValueError(f"{manifest}: the manifest has no rows")
    for column in (options.path_column, options.label_column):
        if column not in rows[0]:
            raise ValueError(
                f"{manifest}: no column {column!r}; columns are {sorted(rows[0])} "
                f"(choose with --path-column / --label-column)"
            )
    raw_labels = [row.get(options.label_column) for row in rows]
    int_labels = [_as_int(v) for v in raw_labels]
    classes: tuple[str, ...] | None
    if all(v is not None for v in int_labels):
        labels, classes = int_labels, None
    else:
        classes = tuple(sorted({str(v) for v in raw_labels}))
        lookup = {name: i for i, name in enumerate(classes)}
        labels = [lookup[str(v)] for v in raw_labels]
    paths = [str(row[options.path_column]) for row in rows]
    return ManifestSource(
        base=manifest.parent.resolve(), rows=tuple(zip(paths, labels)), classes=classes, manifest=manifest
    )

"""A CSV or JSONL manifest listing image paths (relative to the manifest) and labels."""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from fastload._util.files import resolved_inside
from fastload.converters.sample import Sample, SourceItem, file_stamp, make_key, unique_keys
from fastload.converters.sources import SourceOptions
from fastload.errors import SampleError


@dataclass(frozen=True)
class ManifestSource:
    """Rows of (path, label): numeric labels are class indices, names become indices in sorted
    order, an empty label is none."""

    base: Path
    rows: tuple[tuple[str, int | None], ...]
    classes: tuple[str, ...] | None
    manifest: Path
    follow_symlinks: bool = False  # read listed files whose links lead outside the folders below
    allowed_roots: tuple[Path, ...] = ()  # folders besides the manifest's own that rows may read from (--allow-root)

    def refusal(self, full: Path) -> str | None:
        """Why the listed file ``full`` may not be read, or None: it must lie in the manifest's
        folder or an allowed root, links resolved (a link leading out of them only with --follow-symlinks)."""
        roots = (self.base, *self.allowed_roots)
        if any(resolved_inside(root, full) is not None for root in roots):
            return None
        written = Path(os.path.abspath(full))  # the path as listed, ".." taken away, links not followed
        linked = any(written.is_relative_to(spelled) for root in roots for spelled in (Path(os.path.abspath(root)), Path(os.path.realpath(root))))
        if linked and self.follow_symlinks:
            return None
        where = "the manifest's folder and the --allow-root folders" if self.allowed_roots else "the manifest's folder"
        if linked:
            return (f"a link leading outside {where} (-> {os.path.realpath(full)}); pass --follow-symlinks to read it, "
                    "or --allow-root with the folder it leads to")
        return f"outside {where} (-> {os.path.realpath(full)}); pass --allow-root DIR (a folder the manifest may read from) to read it"

    def items(self) -> list[SourceItem]:
        """One item per manifest row, in file order."""
        keys = unique_keys([make_key(path) for path, _ in self.rows])
        out = []
        listed = file_stamp(self.manifest)  # the labels come from it
        for lineno, (key, (path, label)) in enumerate(zip(keys, self.rows), start=1):
            full = self.base / path
            stamp: tuple[int, ...] = ()
            if self.refusal(full) is None:  # nothing outside is looked at
                try:
                    stamp = file_stamp(full)
                except OSError:
                    pass
            where = f"{full} (row {lineno} of {self.manifest.name})"
            out.append(SourceItem(key=key, where=where, size_hint=stamp[0] if stamp else 0, ref=(path, label), stamp=listed + stamp))
        return out

    def load(self, item: SourceItem) -> Sample:
        """Read the listed file's bytes."""
        path, label = item.ref
        refusal = self.refusal(self.base / path)
        if refusal is not None:
            raise SampleError(item.where, refusal)
        try:
            data = (self.base / path).read_bytes()
        except OSError as exc:
            raise SampleError(item.where, f"unreadable: {exc.strerror or exc}") from None
        return Sample(key=item.key, where=item.where, image=data, label=label)


def read_rows(manifest: Path) -> list[dict]:
    """Every row of a CSV, TSV or JSON-lines manifest, as a dict by column."""
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


_NUMERAL = re.compile(r"[+-]?[0-9]+(\.[0-9]*)?")  # "3", "-1", "3.0": what integer and float exports write


def _as_number(value: object) -> int | float | None:
    """The number a label cell spells ("3", 3, "3.0", 3.0), else None (a class name)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str) and _NUMERAL.fullmatch(value.strip()):
        text = value.strip()
        return int(text) if text.lstrip("+-").isdigit() else float(text)
    return None


def _is_empty(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _resolve_labels(raw_labels: list[object], manifest: Path, column: str) -> tuple[list[int | None], tuple[str, ...] | None]:
    """Class indices for the label cells: numbers as the ints they spell, else names as sorted
    classes; an empty cell is no label; a column mixing numbers and names is refused."""
    given = [(row, value, _as_number(value)) for row, value in enumerate(raw_labels, start=1) if not _is_empty(value)]
    numeric = bool(given) and given[0][2] is not None
    odd = next((row for row, _, number in given if (number is not None) != numeric), None)
    if odd is not None:
        kinds = ("a number", "a class name") if numeric else ("a class name", "a number")
        raise ValueError(
            f"{manifest}: column {column!r} mixes numbers and class names: row {given[0][0]}'s label is {kinds[0]}, "
            f"row {odd}'s is {kinds[1]} (a label column holds class indices only or class names only)"
        )
    labels: list[int | None] = [None] * len(raw_labels)
    if numeric:
        for row, _, number in given:
            if isinstance(number, float) and not number.is_integer():
                raise ValueError(f"{manifest}: row {row}'s label in column {column!r} is not a whole number (a class index)")
            labels[row - 1] = int(number)  # type: ignore[arg-type]  # every given cell is a number here (checked above)
        return labels, None
    classes = tuple(sorted({str(value) for _, value, _ in given}))
    lookup = {name: i for i, name in enumerate(classes)}
    for row, value, _ in given:
        labels[row - 1] = lookup[str(value)]
    return labels, classes or None


def open_source(path: str, options: SourceOptions) -> ManifestSource:
    """Read the whole manifest (it is small) and resolve labels to class indices."""
    manifest = Path(path)
    rows = read_rows(manifest)
    if not rows:
        raise ValueError(f"{manifest}: the manifest has no rows")
    for column in (options.path_column, options.label_column):
        if column not in rows[0]:
            raise ValueError(
                f"{manifest}: no column {column!r}; columns are {sorted(rows[0])} "
                f"(choose with --path-column / --label-column)"
            )
    for root in options.allowed_roots:
        if not Path(root).is_dir():
            raise ValueError(f"--allow-root {root}: not a folder")
    labels, classes = _resolve_labels([row.get(options.label_column) for row in rows], manifest, options.label_column)
    paths = [str(row[options.path_column]) for row in rows]
    return ManifestSource(
        base=manifest.parent.resolve(), rows=tuple(zip(paths, labels)), classes=classes, manifest=manifest,
        follow_symlinks=options.follow_symlinks, allowed_roots=tuple(Path(root).absolute() for root in options.allowed_roots),
    )

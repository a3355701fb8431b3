"""Raw dataset sources. Each lists cheap item references, then loads one sample per reference.

A source must be picklable (it is sent to worker processes) and deterministic: the same input
gives the same items in the same order.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fastload._util.files import resolved_inside
from fastload.converters.sample import Sample, SourceItem

SOURCE_MODULES: dict[str, str] = {
    "imagefolder": "fastload.converters.sources.imagefolder",
    "manifest": "fastload.converters.sources.manifest",
    "cifar": "fastload.converters.sources.cifar",
    "mnist": "fastload.converters.sources.mnist",
    "npz": "fastload.converters.sources.arrays",
    "parquet": "fastload.converters.sources.parquet",
    "wds": "fastload.converters.sources.wds",
    "videos": "fastload.converters.sources.videos",
    "audio": "fastload.converters.sources.audio",
    "jsonl": "fastload.converters.sources.jsonl",
    "text": "fastload.converters.sources.text",
}
TEXT_ONLY = ("jsonl", "text")  # sources of documents only; parquet and wds hold documents with --text-field


@dataclass(frozen=True)
class SourceOptions:
    """Options of the raw sources; each source reads the ones that concern it."""

    follow_symlinks: bool = False  # read files that links lead to outside the source root: inside_source
    allowed_roots: tuple[str, ...] = ()  # manifest: folders besides its own that its rows may read from (--allow-root)
    path_column: str = "path"  # manifest
    label_column: str = "label"  # manifest, parquet
    image_column: str = "image"  # parquet
    caption_column: str = "caption"  # videos (a manifest): stored as each sample's txt, where the column exists
    split: str = "train"  # cifar, mnist: "train" or "test"
    text_field: str | None = None  # documents: jsonl's key ("text" if None), parquet's column, wds's member extension
    chunk_bytes: int = 8 << 20  # jsonl: a plain file's items hold about this many bytes of lines (set from --shard-tokens)

    def __post_init__(self) -> None:
        if self.split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {self.split!r}")
        if self.text_field is not None and not self.text_field:
            raise ValueError("text_field must name a field")
        if self.chunk_bytes < 1:
            raise ValueError("chunk_bytes must be >= 1")


class Source(Protocol):
    """What every source module's ``open_source`` returns."""

    classes: tuple[str, ...] | None

    def items(self) -> list[SourceItem]:
        """Every sample's reference, in the source's canonical order."""

    def load(self, item: SourceItem) -> Sample:
        """Read one sample; raises SampleError naming ``item.where`` when it cannot."""


@dataclass(frozen=True)
class Document:
    """One document of a text source: its text, or (``text`` None) why it cannot be read."""

    where: str  # the file and line or row, for errors
    text: str | None
    problem: str | None = None


class TextSource(Protocol):
    """What a source of documents returns from ``open_source`` (with ``text_field`` for parquet and
    wds): items are chunks of documents (a span of a file, a row group, a tar), each read whole. A
    source may also have ``text_runs(item)``, the same documents as ``text_runs`` gives them, read
    without a Python object a document (jsonl's plain chunks)."""

    classes: tuple[str, ...] | None

    def items(self) -> list[SourceItem]:
        """Every chunk's reference, in the source's canonical order; ``size_hint``: its text bytes (about)."""

    def documents(self, item: SourceItem) -> Iterator[Document]:
        """The chunk's documents in order (a problem reported per document, never raised)."""


@dataclass(frozen=True)
class TextRun:
    """Consecutive readable documents of a chunk: their texts and, for errors, where each one is
    (``wheres[k]``: a list, or a sequence naming each one only when asked)."""

    texts: list[str]
    wheres: Sequence[str]


def text_runs(source: TextSource, item: SourceItem) -> Iterator[TextRun | Document]:
    """The chunk's documents in order, readable ones gathered into runs and each unreadable one a
    Document (``text`` None): the source's own ``text_runs`` where it has one, else its
    ``documents`` gathered."""
    own = getattr(source, "text_runs", None)
    return own(item) if own is not None else gather_runs(source.documents(item))


def gather_runs(documents: Iterable[Document]) -> Iterator[TextRun | Document]:
    """``documents`` with consecutive readable ones gathered into runs (each unreadable one as it is)."""
    texts: list[str] = []
    wheres: list[str] = []
    for document in documents:
        if document.text is None:
            if texts:
                yield TextRun(texts, wheres)
                texts, wheres = [], []
            yield document
        else:
            texts.append(document.text)
            wheres.append(document.where)
    if texts:
        yield TextRun(texts, wheres)


def text_problem(value: object, field: str) -> str | None:
    """Why a document's ``field`` value is no text to tokenize (missing, not a string, empty, a lone
    surrogate), else None."""
    if value is None:
        return f"no {field!r} field (or null)"
    if not isinstance(value, str):
        return f"field {field!r} is a {type(value).__name__}, not a string"
    if not value:
        return f"empty document (field {field!r})"
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as exc:  # a JSON escape such as \ud800 decodes to a code point no UTF-8 holds
            return f"field {field!r} holds a lone surrogate at character {exc.start}, not text UTF-8 can hold"
    return None


def decode_text(data: bytes) -> tuple[str | None, str | None]:
    """(text, None) of UTF-8 ``data``, else (None, why): invalid UTF-8 is named by its byte offset."""
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, f"invalid UTF-8 at byte {exc.start}"


def open_source(kind: str, path: str, options: SourceOptions = SourceOptions()) -> Source:
    """Open a raw dataset of the given kind (a key of ``SOURCE_MODULES``)."""
    if kind not in SOURCE_MODULES:
        raise ValueError(f"unknown source {kind!r}; expected one of {sorted(SOURCE_MODULES)}")
    module = importlib.import_module(SOURCE_MODULES[kind])
    return module.open_source(path, options)


def inside_source(root: str | os.PathLike[str], path: Path, follow_symlinks: bool) -> Path:
    """``path``, a file a source reads under its ``root``, where it stays inside ``root`` once
    symlinks are resolved (compared part by part: ``ds-private`` is not inside ``ds``), or
    anywhere with ``follow_symlinks``; else a ValueError naming it. Every source reads through it."""
    if not follow_symlinks and resolved_inside(root, path) is None:
        raise ValueError(f"{path}: leads outside the source root (-> {os.path.realpath(path)}); pass --follow-symlinks to read it")
    return path

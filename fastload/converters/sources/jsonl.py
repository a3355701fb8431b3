"""JSON Lines documents (``--from jsonl``): one JSON object a line, its text under ``--text-field``
(default ``text``). Plain files are cut into chunks of about ``chunk_bytes`` at line ends, so one big
file converts on every worker; ``.gz`` and ``.zst`` files are read as they stream, one item each
(a compressed stream cannot be entered in the middle). A line ends at ``\\n`` only; one longer than
MAX_LINE_BYTES is a bad document, read past in pieces. A plain chunk is read at once and each line
parsed at once, from a view of the chunk (by orjson where installed, else json), its good documents
handed on as runs of texts (``text_runs``: no Python object a document); a line that parse does not
take as a good document is read again as every line was, so every document and every reason stays
the same."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import IO, Any, cast, overload

from fastload.converters.sample import SourceItem, file_stamp, make_key
from fastload.converters.sources import Document, SourceOptions, TextRun, decode_text, gather_runs, inside_source, text_problem

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".ndjson")
COMPRESSED_RATIO = 4  # a compressed file's size_hint: its bytes times this (text compresses about 3-5x)
MAX_LINE_BYTES = 16 << 20  # a longer line is a bad document, read past in pieces, never held whole
PIECE_BYTES = 1 << 20  # the pieces a line too long is read past in
WHOLE_CHUNK_BYTES = MAX_LINE_BYTES  # a plain chunk up to this size (so no line too long) is read at once
NESTING = 64  # a record nesting this deep is read by json as before (its recursion limit may refuse it)


@lru_cache(maxsize=1)
def _parser() -> tuple[Callable[[memoryview], Any], bool]:
    """The JSON parser of a view of a line's bytes, raising on what it does not take: orjson's (the
    ``text`` extra) where installed, else json's over its UTF-8; and whether it refuses lone
    surrogates (orjson does: ``\\ud800`` alone is an error to it, a str holding one to json)."""
    try:
        import orjson
    except ImportError:
        return (lambda line: json.loads(str(line, "utf-8"))), False
    return cast(Callable[[memoryview], Any], orjson.loads), True


def _shallow(record: dict) -> bool:
    """Whether no value of ``record`` nests lists and objects NESTING deep."""
    level, depth = [v for v in record.values() if type(v) in (dict, list)], 1
    while level:
        if depth >= NESTING:
            return False
        level = [w for v in level for w in (v.values() if type(v) is dict else v) if type(w) in (dict, list)]
        depth += 1
    return True


def _read_span(path: Path, start: int, end: int) -> bytes:
    """Bytes ``start`` to ``end`` of the file ``path``."""
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


class _LineNames(Sequence[str]):
    """Where each document of a run of a chunk's lines is (``PATH: line at byte N``), named only when asked."""

    def __init__(self, path: Path, starts: list[int]) -> None:
        self.path, self.starts = path, starts

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, k: int) -> str: ...
    @overload
    def __getitem__(self, k: slice) -> list[str]: ...
    def __getitem__(self, k: int | slice) -> str | list[str]:
        if isinstance(k, slice):
            return [f"{self.path}: line at byte {start}" for start in self.starts[k]]
        return f"{self.path}: line at byte {self.starts[k]}"


def _compression(path: Path) -> str | None:
    return {".gz": "gzip", ".zst": "zstd"}.get(path.suffix)


class _Cut(EOFError):
    """The end of a stream whose file is cut short (or holds bytes that are no frame of it)."""


class _CutReader(io.RawIOBase):
    """A zstd stream whose end raises _Cut(``cut``) where its file's frames are cut, as gzip's
    reader raises at a cut stream's end (the line it cuts is then lost with the rest)."""

    def __init__(self, raw: IO[bytes], cut: str | None) -> None:
        super().__init__()
        self.raw, self.cut = raw, cut

    def readable(self) -> bool:
        """A reader."""
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        """Decompressed bytes into ``buffer``; at the end of a cut stream, _Cut."""
        n = self.raw.readinto(buffer)  # type: ignore[attr-defined]
        if not n and self.cut is not None:
            raise _Cut(self.cut)
        return n

    def close(self) -> None:
        """Close the zstd reader and its file."""
        self.raw.close()
        super().close()


def _open_stream(path: Path) -> IO[bytes]:
    """The decompressed bytes of ``path`` as a stream (nothing decompressed ahead of reading); a
    cut zstd file's stream raises _Cut where it ends."""
    kind = _compression(path)
    if kind == "gzip":
        return cast(IO[bytes], gzip.open(path, "rb"))
    if kind == "zstd":
        try:
            import zstandard
        except ImportError:
            raise ImportError(f"{path}: reading .zst needs zstandard: pip install 'fastload[text]'") from None
        cut = _zstd_cut(path)
        return io.BufferedReader(_CutReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True), cut))
    return open(path, "rb")


def _lines(stream: IO[bytes], budget: int | None = None) -> Iterator[tuple[bytes | None, int]]:
    """Each line of ``stream`` (ended by \\n, the only line end, or by the stream's) and its length
    in bytes; a line longer than MAX_LINE_BYTES as None, read past in pieces of PIECE_BYTES (never
    held whole). ``budget``: stop once that many bytes were read."""
    read = 0
    while (budget is None or read < budget) and (line := stream.readline(MAX_LINE_BYTES + 1)):
        size = len(line)
        if size > MAX_LINE_BYTES and not line.endswith(b"\n"):
            del line
            ended = False
            while not ended and (piece := stream.readline(PIECE_BYTES)):
                size += len(piece)
                ended = piece.endswith(b"\n")
            yield None, size
        else:
            yield line, size
        read += size


ZSTD_MAGIC = 0xFD2FB528
ZSTD_SKIPPABLE = 0x184D2A50  # the magic of a skippable frame, its low 4 bits any


def _zstd_cut(path: Path) -> str | None:
    """Where a .zst file's frames do not end with the file (cut short inside a frame, or bytes that
    are no frame), else None: read header by header (frame and block headers, nothing decompressed),
    since the zstandard reader ends a cut stream as if it were whole."""
    size = path.stat().st_size
    at = 0
    with open(path, "rb") as f:
        while at < size:
            f.seek(at)
            head = f.read(5)
            magic = int.from_bytes(head[:4], "little")
            if len(head) >= 4 and magic & 0xFFFFFFF0 == ZSTD_SKIPPABLE:
                f.seek(at + 4)
                at += 8 + int.from_bytes(f.read(4).ljust(4, b"\xff"), "little")
                continue
            if len(head) < 5:
                return f"cut short inside a frame header at byte {at}"
            if magic != ZSTD_MAGIC:
                return f"no zstd frame at byte {at}"
            flags = head[4]  # frame content size size, single segment, checksum, dictionary id size
            single = flags >> 5 & 1
            at += 5 + (not single) + (0, 1, 2, 4)[flags & 3] + (single, 2, 4, 8)[flags >> 6]
            last = False
            while not last and at < size:
                f.seek(at)
                block = int.from_bytes(f.read(3).ljust(3, b"\0"), "little")
                last = bool(block & 1)
                at += 3 + (1 if block >> 1 & 3 == 1 else block >> 3)  # an RLE block holds its one byte
            at += 4 * (flags >> 2 & 1) if last else 1  # a frame whose last block is missing is cut
    return f"cut short inside a frame: {size} bytes, the frame needs {at}" if at > size else None


def _decompress_errors(kind: str) -> tuple[type[Exception], ...]:
    """The error ``kind``'s decompressor raises on corrupt data, beyond EOFError, OSError and zlib.error."""
    if kind != "zstd":
        return ()
    try:
        import zstandard
    except ImportError:
        return ()  # nothing was decompressed: _open_stream named the extra to install
    return (zstandard.ZstdError,)


def _damage_reason(exc: BaseException) -> str:
    """What a decompressor's error says of the stream, in words that echo none of its bytes."""
    if isinstance(exc, _Cut):
        return str(exc)
    if isinstance(exc, EOFError):
        return "cut short: it ends before its end-of-stream marker"
    if isinstance(exc, gzip.BadGzipFile) and str(exc).startswith("Not a gzipped file"):
        return "not gzip data"
    if isinstance(exc, zlib.error):
        return "corrupt deflate data"
    if isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile):
        return f"unreadable: {exc.strerror or exc}"
    return str(exc) or type(exc).__name__


def _line_ends(path: Path, size: int, chunk: int) -> list[int]:
    """Byte offsets cutting a plain file into chunks of about ``chunk`` bytes, each just after a newline."""
    cuts = [0]
    with open(path, "rb") as f:
        while cuts[-1] + chunk < size:
            f.seek(cuts[-1] + chunk)
            while (rest := f.readline(PIECE_BYTES)) and not rest.endswith(b"\n"):
                pass  # a long line, read past in pieces
            if not rest:
                break  # the last line runs to the end of the file
            cuts.append(f.tell())
    return [*cuts, size] if cuts[-1] < size else cuts


@dataclass(frozen=True)
class JsonlSource:
    """JSON Lines files (a file, or a folder's, sorted by path) as documents."""

    files: tuple[Path, ...]
    root: Path
    text_field: str
    chunk_bytes: int
    classes: tuple[str, ...] | None = None

    def items(self) -> list[SourceItem]:
        """Each plain file's chunks, each compressed file whole, in path order."""
        out = []
        for path in self.files:
            stamp, name = file_stamp(path), make_key(path.relative_to(self.root).as_posix() if path != self.root else path.name)
            size = path.stat().st_size
            if _compression(path) is not None:
                out.append(SourceItem(key=name, where=str(path), size_hint=size * COMPRESSED_RATIO, ref=(path, 0, -1), stamp=stamp))
                continue
            cuts = _line_ends(path, size, self.chunk_bytes)
            for n, (start, end) in enumerate(itertools.pairwise(cuts)):
                out.append(SourceItem(key=f"{name}_{n:05d}", where=f"{path} (bytes {start}..{end})", size_hint=end - start,
                                      ref=(path, start, end), stamp=stamp))
        return out

    def documents(self, item: SourceItem) -> Iterator[Document]:
        """Each non-blank line's text (lines named by their number in a stream, by their byte offset in a chunk)."""
        path, start, end = item.ref
        if end < 0:
            yield from self._stream_documents(path)
            return
        if end - start <= WHOLE_CHUNK_BYTES:
            for run in self._chunk_runs(path, start, _read_span(path, start, end)):
                if isinstance(run, Document):
                    yield run
                else:
                    yield from map(Document, run.wheres, run.texts)
            return
        with open(path, "rb") as f:
            f.seek(start)
            offset = start
            for line, size in _lines(f, end - start):
                yield from self._line_document(f"{path}: line at byte {offset}", line, size)
                offset += size

    def text_runs(self, item: SourceItem) -> Iterator[TextRun | Document]:
        """The item's documents as ``fastload.converters.sources.text_runs`` gives them: a plain
        chunk's lines parsed at once, with no Python object a document; any other item's gathered."""
        path, start, end = item.ref
        if end >= 0 and end - start <= WHOLE_CHUNK_BYTES:
            yield from self._chunk_runs(path, start, _read_span(path, start, end))
        else:
            yield from gather_runs(self.documents(item))

    def _chunk_runs(self, path: Path, offset: int, data: bytes) -> Iterator[TextRun | Document]:
        """The documents of a plain chunk's bytes ``data`` (from byte ``offset``), as ``documents``
        read them line by line: a line parsed to a text field that needs no further check (a
        non-empty string, with no lone surrogate, in a record nesting less than NESTING deep) joins
        the run of texts (each named by its line's offset only when asked); any other non-blank
        line is read again by ``_document``, with its newline, and so named as before (a document
        it reads joins the run; a bad one ends it). Each line is parsed from a view of ``data``,
        not copied out of it."""
        (loads, whole_text), field = _parser(), self.text_field
        view, find, size = memoryview(data), data.find, len(data)
        texts: list[str] = []
        starts: list[int] = []
        at = 0
        while at < size:
            stop = find(b"\n", at)
            stop = size if stop < 0 else stop
            try:
                record = loads(view[at:stop])
            except (ValueError, RecursionError):  # orjson's and json's errors (UnicodeDecodeError is a ValueError); a blank line
                record = None
            value = record.get(field) if type(record) is dict else None
            if type(value) is str and value and (whole_text or value.isascii() or text_problem(value, field) is None) and (len(record) == 1 or _shallow(record)):
                texts.append(value)
                starts.append(offset + at)
            elif not (line := data[at:stop]).isspace() and line:
                ended = stop < size
                (document,) = self._line_document(f"{path}: line at byte {offset + at}", line + b"\n" if ended else line, len(line) + ended)
                if document.text is not None:
                    texts.append(document.text)
                    starts.append(offset + at)
                else:
                    if texts:
                        yield TextRun(texts, _LineNames(path, starts))
                        texts, starts = [], []
                    yield document
            at = stop + 1
        if texts:
            yield TextRun(texts, _LineNames(path, starts))

    def _stream_documents(self, path: Path) -> Iterator[Document]:
        """A compressed file's documents, then, where its stream is damaged (cut short, corrupt),
        one standing for what the damage lost, naming the file: the line cut by it and every
        line after, their number unknown."""
        kind = cast(str, _compression(path))
        number = 0  # the lines read whole
        reason = None
        damage: tuple[type[Exception], ...] = (EOFError, OSError, zlib.error, *_decompress_errors(kind))
        try:
            with _open_stream(path) as stream:
                for line, size in _lines(stream):
                    number += 1
                    yield from self._line_document(f"{path}:{number}", line, size)
        except damage as exc:
            reason = _damage_reason(exc)
        if reason is not None:
            yield Document(str(path), None, f"damaged {kind} stream ({reason}): the documents from line {number + 1} on are lost, their number unknown")

    def _line_document(self, where: str, line: bytes | None, size: int) -> Iterator[Document]:
        """The line's document: none for a blank line; a bad one for a line too long (None)."""
        if line is None:
            yield Document(where, None, f"line too long ({size} bytes, more than the {MAX_LINE_BYTES >> 20} MiB a line may hold)")
        elif not line.isspace():
            yield self._document(where, line)

    def _document(self, where: str, line: bytes) -> Document:
        text, problem = decode_text(line)
        if text is None:
            return Document(where, None, problem)
        try:
            record = json.loads(text)
        except ValueError as exc:
            return Document(where, None, f"not JSON ({type(exc).__name__} at column {getattr(exc, 'colno', '?')})")
        except RecursionError:
            return Document(where, None, "JSON nested too deeply to read (deeper than Python's recursion limit)")
        if not isinstance(record, dict):
            return Document(where, None, f"a JSON {type(record).__name__}, not an object with a {self.text_field!r} field")
        value = record.get(self.text_field)
        problem = text_problem(value, self.text_field)
        return Document(where, None, problem) if problem else Document(where, value)


def open_source(path: str, options: SourceOptions) -> JsonlSource:
    """Open a JSON Lines file or a folder of them (``.jsonl``, ``.json``, ``.ndjson``, compressed
    ``.gz``/``.zst``; one linked from outside the folder refused, unless ``follow_symlinks``)."""
    p = Path(path)
    if p.is_dir():
        files = tuple(inside_source(p, f, options.follow_symlinks)
                      for f in sorted(p.rglob("*")) if f.is_file() and any(f.name.endswith(s) for s in SUFFIXES))
        root = p
    else:
        files, root = (p,), p.parent
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"{path}: no JSON Lines files ({', '.join(SUFFIXES)})")
    for f in files:
        if not os.access(f, os.R_OK):
            raise PermissionError(f"{f}: cannot read it")
    return JsonlSource(files=files, root=root, text_field=options.text_field or "text", chunk_bytes=options.chunk_bytes)

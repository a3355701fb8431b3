"""A column of data read in place (Parquet, ``datasets.save_to_disk`` Arrow, Lance: a row a document) as
one global token space, read span by span as token shards are (fastload.text.token_corpus): the same
stream, rows, labels, positions and resume as the same documents converted to token shards. The column
holds each document's token ids (a list of integers, ``input_ids`` by default), or its text, encoded in
the workers with the tokenizer named (as ``fastload convert --tokenizer`` encodes it, adding no special
tokens).

Where each document starts is a *document table* fastload makes once, from one pass over the column
(each part read in bounded batches, a text column's texts encoded; in a fresh Python process: pylance is
not fork-safe) and keeps in the cache folder beside the dataset's in-place index (``in-place/``, named
by the dataset's location and index, the column and the tokenizer, so a changed file or another
column makes another): a token shard's ``.docs`` table (fastload.formats.tokens.reader) of the whole
column, memory-mapped, 8 bytes a row; the parts' first tokens are read from it. A text column's pass
also encodes every text with fastokens and keeps, beside the table (``.encoder``), whether it gave
every row ``tokenizers``' ids. A span is then read from the row holding it, out of the process's
cache of decoded batches (fastload.formats.in_place_reader), its ids checked (none below 0; below the
vocabulary of the tokenizer named), or its text encoded: a batch's texts not among those the process
encoded last (kept, so a document cut across rows or batches is encoded once) in one call, by
fastokens in the calling thread alone where that pass found it exact (made in the process that
encodes, after a fork; no pool thread to fork with), else by ``tokenizers`` one text at a time."""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import logging
import mmap
import operator
import os
import time
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from fastload._util.files import open_lock_file, temporary_beside
from fastload._util.processes import in_fresh_process
from fastload.errors import ShardError
from fastload.formats.in_place_reader import MAX_ID, InPlaceReader
from fastload.formats.index import TokenizerIdentity
from fastload.formats.part_table import PartTable
from fastload.formats.tokens.reader import DOCS_MAGIC, documents_header
from fastload.storage.dataset import ShardedDataset
from fastload.storage.in_place_index import CACHE_FOLDER
from fastload.text import fast_encoder
from fastload.text.token_corpus import Segments, TokenCorpus
from fastload.text.tokenizer import TextTokenizer

DEFAULT_FIELD = "input_ids"
HEADER_BYTES = 64  # a document table's header (fastload.formats.tokens.reader)
TEXT_BATCH = 1024  # texts encoded at once when a text column's table is made
ENCODED_TOKENS = 1 << 22  # a process keeps the ids of the texts it encoded last, up to this many
log = logging.getLogger("fastload")


def _reader(dataset: ShardedDataset, part: int) -> InPlaceReader:
    """Part ``part``'s reader, open in this process."""
    reader = dataset.reader(part)
    assert isinstance(reader, InPlaceReader)  # a layout read in place opens in-place readers
    return reader


def encoded_texts(encoder: TextTokenizer, texts: list[str | None]) -> list[np.ndarray]:
    """Each text's ids (int64; a null or empty text: none): all in one call by fastokens (in this thread alone,
    so a process may fork after) where ``encoder`` is fast, else one text at a time by ``tokenizers`` (no thread pool)."""
    present = [text for text in texts if text]
    if not present:
        return [np.zeros(0, dtype=np.int64) for _ in texts]
    if encoder.fast:
        fast_encoder.one_thread()
        flat, lengths = encoder.encode_arrays(present)
        pieces = iter(np.split(flat.astype(np.int64), np.cumsum(lengths)[:-1]))
    else:
        pieces = (np.asarray(ids, dtype=np.int64) for ids in encoder.encode_each(present))
    return [next(pieces) if text else np.zeros(0, dtype=np.int64) for text in texts]


def installed_fast_encoder() -> str | None:
    """fastokens' library and version where it is installed (None: it is not)."""
    try:
        return fast_encoder.version()
    except ImportError:
        return None


class _TextCount:
    """A text column's ids counted ``TEXT_BATCH`` rows at a time by ``tokenizers`` (the ids the workers must
    give), every text also encoded by fastokens (``fast``) until one's ids differ: whether the workers may
    encode the column with it, checked on every row rather than a sample."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer, self.version = tokenizer, installed_fast_encoder()
        self.fast: TextTokenizer | None = replace(tokenizer, fast=True) if self.version is not None else None
        self.why = "" if self.version is not None else "fastokens is not installed"

    def lengths(self, reader: InPlaceReader, column: str) -> np.ndarray:
        """Each row's number of ids, its text in ``column`` encoded (a null: none)."""
        lengths = np.zeros(len(reader), dtype=np.int64)
        for first in range(0, len(reader), TEXT_BATCH):
            texts = [text or "" for text in reader.texts(range(first, min(first + TEXT_BATCH, len(reader))), column)]
            flat, lengths[first : first + len(texts)] = self.tokenizer.encode_arrays(texts)
            if self.fast is not None:
                self._compare(texts, flat, lengths[first : first + len(texts)], reader, first)
        return lengths

    def _compare(self, texts: list[str], flat: np.ndarray, lengths: np.ndarray, reader: InPlaceReader, first: int) -> None:
        """Stop encoding with fastokens where its ids of ``texts`` differ from ``tokenizers``' (``flat``, ``lengths``), saying where."""
        assert self.fast is not None
        try:
            fast_flat, fast_lengths = self.fast.encode_arrays(texts)
        except ValueError as exc:  # a tokenizer.json fastokens cannot encode exactly
            self.fast, self.why = None, str(exc)
            return
        if np.array_equal(fast_lengths, lengths) and np.array_equal(fast_flat, flat):
            return
        differs = next(n for n, (a, b) in enumerate(zip(np.split(fast_flat, np.cumsum(fast_lengths)[:-1]), np.split(flat, np.cumsum(lengths)[:-1])))
                       if not np.array_equal(a, b))
        self.fast, self.why = None, f"{reader.key(first + differs)}: fastokens' ids differ from tokenizers'"

    def verdict(self) -> dict[str, str | None]:
        """What the table's ``.encoder`` file keeps: the fastokens that gave every row tokenizers' ids (else None, and why not)."""
        return {"fast": self.version if self.fast is not None else None, "why": self.why or None}


def build_table(dataset: ShardedDataset, field: str, vocab_size: int | None, path: str, tokenizer: TextTokenizer | None = None) -> int:
    """Write the document table of column ``field`` of ``dataset`` to ``path`` (every part read once, in
    bounded batches, its offsets written part by part: nothing held per row; a list of ids checked, a text
    encoded with ``tokenizer``, and by fastokens, whether it gives every text the same ids written beside it:
    :func:`encoder_file`); returns its rows."""
    fd, tmp = temporary_beside(path)
    rows = tokens = 0
    count = _TextCount(tokenizer) if tokenizer is not None else None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(bytes(HEADER_BYTES + 8))  # the header, written last, and the first offset, 0
            for part in range(len(dataset.index.shards)):
                reader = _reader(dataset, part)
                lengths = reader.list_lengths(field, vocab_size) if count is None else count.lengths(reader, field)
                file.write((tokens + np.cumsum(lengths)).astype("<u8").tobytes())
                rows, tokens = rows + len(lengths), tokens + int(lengths.sum())
            file.seek(0)
            file.write(documents_header(rows, tokens, np.dtype(np.int64).itemsize))
        if count is not None:
            encoder_file(Path(path)).write_text(json.dumps(count.verdict()))  # before the table: a table made has its verdict
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        dataset.close()
    return rows


def encoder_file(table: Path) -> Path:
    """Where a text column's table keeps which fastokens gave every row ``tokenizers``' ids (JSON)."""
    return table.with_suffix(".encoder")


class ColumnCorpus(TokenCorpus):
    """Column ``field`` (None: ``input_ids``) of ``dataset``, data read in place, as a token corpus: a row a
    document, a list of ids or a text; ``tokenizer`` (a tokenizer.json or folder; optional for ids) gives the
    pad and eos ids and the vocabulary every id is checked against, and encodes a text column."""

    def __init__(self, dataset: ShardedDataset, field: str | None = None, tokenizer: str | None = None) -> None:
        self.dataset, self.field = dataset, field or DEFAULT_FIELD
        role = dataset.index.columns.get(self.field)
        if role is None:
            raise ValueError(f"{dataset.location}: no column {self.field!r} of token ids (its columns: {', '.join(dataset.index.columns)}); "
                             "name the column holding each row's token ids (or its text, with tokenizer=) with fields=[COLUMN]")
        if role not in ("array", "text"):
            raise ValueError(f"{dataset.location}: column {self.field!r} holds {role}, not lists of token ids nor text")
        if role == "text" and tokenizer is None:
            raise ValueError(f"{dataset.location}: column {self.field!r} holds text: name the tokenizer that encodes it with tokenizer=")
        self.tokenizer: TokenizerIdentity | None = None
        self.vocab_size: int | None = None
        self.encoder = TextTokenizer(tokenizer) if role == "text" and tokenizer is not None else None  # encodes each row's text
        fast = installed_fast_encoder() if self.encoder is not None else None  # a text column's table says whether this one may encode it
        self._encoded: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()  # the rows this process encoded last
        self._encoded_ids = 0  # the ids they hold
        self.pad_id = 0
        if tokenizer is not None:
            self.tokenizer = TextTokenizer(tokenizer).identity
            self.vocab_size = self.tokenizer.vocab_size
            self.pad_id = next(i for i in (self.tokenizer.pad_id, self.tokenizer.eos_id, 0) if i is not None)
        self.dtype = np.dtype(np.int64)
        self.doc_starts = np.concatenate([[0], np.cumsum(dataset.index.shard_samples())]).astype(np.int64)
        parts = PartTable.of(dataset.index.shards)  # its files (but their mtimes) and their parts: what the ids are read from
        files = [(path, size, footer, sha256, version) for path, size, footer, _, sha256, version in parts.files]
        read = hashlib.sha256(json.dumps(files).encode() + parts.parts.tobytes()).hexdigest()
        self.source = json.dumps([read, self.field, self.tokenizer.sha256 if self.tokenizer is not None else None])
        index = hashlib.sha256(dataset.index.to_json().encode()).hexdigest()  # mtimes too: a file rewritten is counted again
        name = hashlib.sha256(json.dumps([dataset.location, index, self.source, *([fast] if self.encoder is not None else [])]).encode()).hexdigest()[:32]
        self.table = dataset.kept_in() / CACHE_FOLDER / f"{name}.docs"
        self._map: mmap.mmap | None = None
        self._offsets: np.ndarray | None = None
        if not self.table.exists():
            self._make_table()
        self.token_starts = self.offsets()[self.doc_starts].astype(np.int64)
        if self.encoder is not None and fast is not None and self._verdict().get("fast") == fast:
            self.encoder = replace(self.encoder, fast=True)  # fastokens gave every row tokenizers' ids: it encodes them in the workers

    def _verdict(self) -> dict[str, Any]:
        """The text column's ``.encoder`` file: which fastokens gave every row ``tokenizers``' ids (none: tokenizers encodes)."""
        try:
            verdict = json.loads(encoder_file(self.table).read_text())
        except (OSError, ValueError):
            return {}
        return verdict if isinstance(verdict, dict) else {}

    def _make_table(self) -> None:
        """Make the document table, one process at a time (the ranks of a machine opening it at once make it once)."""
        self.table.parent.mkdir(parents=True, exist_ok=True)
        fd = open_lock_file(self.table.with_name(self.table.name + ".lock"))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self.table.exists():  # made while this process waited
                return
            start = time.perf_counter()
            in_fresh_process(build_table, self.dataset, self.field, self.vocab_size, str(self.table), self.encoder)
            log.warning("%s: counted the token ids of column %r in %.1fs (kept in %s)", self.dataset.location, self.field,
                        time.perf_counter() - start, self.table)
            why = self._verdict().get("why") if self.encoder is not None else None
            if why:
                log.warning("%s: column %r is encoded by tokenizers, one text at a time, not fastokens (%s)", self.dataset.location, self.field, why)
        finally:
            os.close(fd)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_map"], state["_offsets"], state["_encoded"], state["_encoded_ids"] = None, None, OrderedDict(), 0  # each process its own
        if self.encoder is not None:
            state["encoder"] = replace(self.encoder)  # without the encoders this process loaded
        return state

    def offsets(self) -> np.ndarray:
        """Every row's first token, then the column's token count (uint64, memory-mapped); its header
        checked against the dataset's rows, and a table cut short since it was mapped is a ShardError."""
        if self._offsets is None:
            try:
                with open(self.table, "rb") as file:
                    self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise ShardError(f"{self.table}: cannot map the document table of column {self.field!r} ({exc})") from None
            rows = self.documents
            count, tokens = np.frombuffer(self._map, dtype="<u8", count=2, offset=8).tolist() if len(self._map) >= HEADER_BYTES else (-1, -1)
            if bytes(self._map[:8]) != DOCS_MAGIC or count != rows or len(self._map) != HEADER_BYTES + 8 * (rows + 1):
                raise ShardError(f"{self.table}: not the document table of the {rows} rows of column {self.field!r} (delete it to make it again)")
            self._offsets = np.frombuffer(self._map, dtype="<u8", offset=HEADER_BYTES)
            if self._offsets[0] != 0 or self._offsets[-1] != tokens:
                raise ShardError(f"{self.table}: its offsets do not run from 0 to its {tokens} tokens (delete it to make it again)")
        assert self._map is not None
        if self._map.size() < len(self._map):
            raise ShardError(f"{self.table}: cut short (truncated since it was mapped?)")
        return self._offsets

    @property
    def documents(self) -> int:
        """Rows (documents) in the dataset."""
        return int(self.doc_starts[-1])

    def starts_inside(self, start: int, end: int) -> np.ndarray:
        """Global positions of the documents starting strictly between ``start`` and ``end`` (empty rows: none)."""
        offsets = self.offsets()
        lo, hi = int(np.searchsorted(offsets, start, side="right")), int(np.searchsorted(offsets, end, side="left"))
        return np.unique(offsets[lo:hi].astype(np.int64))

    def starts_document(self, token: int) -> bool:
        """Whether a document starts at global token ``token`` (the end of the tokens: True)."""
        if token >= self.total:
            return True
        offsets = self.offsets()
        at = int(np.searchsorted(offsets, token, side="left"))
        return at < len(offsets) and int(offsets[at]) == token

    def documents_at(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first global token, tokens) of rows ``indices``."""
        offsets = self.offsets()
        first, end = offsets[indices].astype(np.int64), offsets[indices + 1].astype(np.int64)
        if np.any(end < first):
            raise ShardError(f"{self.table}: its offsets do not ascend (delete it to make it again)")
        return first, end - first

    def _rows_of(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(part, row in it, the row's first global token, its ids) of the row holding each global token of ``tokens``."""
        offsets = self.offsets()
        documents = np.searchsorted(offsets, tokens, side="right").astype(np.int64) - 1
        parts = np.searchsorted(self.doc_starts, documents, side="right") - 1
        firsts = offsets[documents].astype(np.int64)
        return parts, documents - self.doc_starts[parts], firsts, offsets[documents + 1].astype(np.int64) - firsts

    def read_into(self, buffer: np.ndarray, segments: Segments, destinations: np.ndarray, extra: np.ndarray) -> np.ndarray:
        """Each segment's ids into ``buffer`` at its destination, read from the row holding it (with the row's
        next id where ``extra`` says so, also returned); every id read checked."""
        nexts = np.zeros(len(segments.start), dtype=np.int64)
        counts = segments.length + extra
        parts, rows, firsts, sizes = self._rows_of(segments.start)
        held = self._ids(list(zip(parts.tolist(), rows.tolist())))
        for n, (part, row, first, size, start, count, dest, more) in enumerate(zip(
                parts.tolist(), rows.tolist(), firsts.tolist(), sizes.tolist(), segments.start.tolist(), counts.tolist(),
                destinations.tolist(), extra.tolist())):
            ids = held[part, row]
            if len(ids) != size:
                raise ShardError(f"{_reader(self.dataset, part).key(row)}: holds {len(ids)} ids in column {self.field!r}, the document table "
                                 f"{size} (the file changed since it was indexed?)")
            buffer[dest : dest + count] = ids[start - first : start - first + count]
            if more:
                nexts[n] = buffer[dest + count - 1]
        end = int((destinations + segments.length).max(initial=0))
        highest = MAX_ID if self.vocab_size is None else self.vocab_size - 1
        if min(int(buffer[:end].min(initial=0)), int(nexts.min(initial=0))) < 0 or max(int(buffer[:end].max(initial=0)), int(nexts.max(initial=0))) > highest:
            for part, row, first, start, count in zip(parts.tolist(), rows.tolist(), firsts.tolist(), segments.start.tolist(), counts.tolist()):
                _reader(self.dataset, part).check_ids(row, self.field, held[part, row][start - first : start - first + count], self.vocab_size)
        return nexts

    def _ids(self, rows: list[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
        """The ids of each (part, row) of ``rows``: its list, or its text encoded, those not among the last
        ENCODED_TOKENS ids this process encoded read and encoded in one call (a document cut across rows, or
        read by the next batch, is encoded once)."""
        if self.encoder is None:
            return {(part, row): _reader(self.dataset, part).list_values(row, self.field) for part, row in rows}
        held: dict[tuple[int, int], np.ndarray] = {}
        for key in rows:
            ids = self._encoded.get(key)
            if ids is not None:
                self._encoded.move_to_end(key)
                held[key] = ids
        missing = sorted(set(rows) - held.keys())
        texts = [text for part, group in itertools.groupby(missing, key=operator.itemgetter(0))
                 for text in _reader(self.dataset, part).texts([row for _, row in group], self.field)]
        for key, ids in zip(missing, encoded_texts(self.encoder, texts)):
            held[key] = self._encoded[key] = ids
            self._encoded_ids += len(ids)
        while self._encoded_ids > ENCODED_TOKENS and len(self._encoded) > 1:
            self._encoded_ids -= len(self._encoded.popitem(last=False)[1])
        return held

    def named(self, token: int) -> dict[str, Any]:
        """The file (a Lance dataset, with its fragment), the row as its key names it, and the token's offset in it."""
        parts, rows, firsts, _ = self._rows_of(np.array([token], dtype=np.int64))
        shard = self.dataset.index.shards[int(parts[0])]
        named: dict[str, Any] = {"shard": shard.path, "document": (shard.first_row or 0) + int(rows[0]), "offset": token - int(firsts[0])}
        if self.dataset.index.layout == "lance":
            named["fragment"] = shard.row_group
        return named

    def identity(self) -> str:
        """The files read (their names, sizes and footers: not where they lie, nor their mtimes), their parts, the column and the tokenizer."""
        return self.source

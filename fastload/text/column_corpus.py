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
column, memory-mapped, 8 bytes a row; the parts' first tokens are read from it. A span is then read
from the row holding it, out of the process's cache of decoded batches
(fastload.formats.in_place_reader), its ids checked (none below 0; below the vocabulary of the
tokenizer named), or its text encoded (the texts a process encoded last kept, so a document cut
across rows is encoded once)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import mmap
import os
import time
from collections import OrderedDict
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


def text_ids(tokenizer: TextTokenizer, reader: InPlaceReader, row: int, column: str) -> np.ndarray:
    """Row ``row``'s text in ``column`` encoded (one text at a time: no thread pool, so a process may fork after; a null: no ids)."""
    text = reader.read(row, (column,)).get(column)
    return np.asarray(tokenizer.encode_each([text.decode("utf-8", "surrogatepass")])[0] if text else [], dtype=np.int64)


def text_lengths(tokenizer: TextTokenizer, reader: InPlaceReader, column: str) -> np.ndarray:
    """Each row's number of ids, its text in ``column`` encoded ``TEXT_BATCH`` rows at a time (a null: none)."""
    lengths = np.zeros(len(reader), dtype=np.int64)
    for first in range(0, len(reader), TEXT_BATCH):
        rows = range(first, min(first + TEXT_BATCH, len(reader)))
        texts = [reader.read(row, (column,)).get(column, b"").decode("utf-8", "surrogatepass") for row in rows]
        lengths[first : first + len(texts)] = tokenizer.encode_arrays(texts)[1] if texts else []
    return lengths


def build_table(dataset: ShardedDataset, field: str, vocab_size: int | None, path: str, tokenizer: TextTokenizer | None = None) -> int:
    """Write the document table of column ``field`` of ``dataset`` to ``path`` (every part read once, in
    bounded batches, its offsets written part by part: nothing held per row; a list of ids checked, a text
    encoded with ``tokenizer``); returns its rows."""
    fd, tmp = temporary_beside(path)
    rows = tokens = 0
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(bytes(HEADER_BYTES + 8))  # the header, written last, and the first offset, 0
            for part in range(len(dataset.index.shards)):
                reader = _reader(dataset, part)
                lengths = reader.list_lengths(field, vocab_size) if tokenizer is None else text_lengths(tokenizer, reader, field)
                file.write((tokens + np.cumsum(lengths)).astype("<u8").tobytes())
                rows, tokens = rows + len(lengths), tokens + int(lengths.sum())
            file.seek(0)
            file.write(documents_header(rows, tokens, np.dtype(np.int64).itemsize))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        dataset.close()
    return rows


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
        name = hashlib.sha256(json.dumps([dataset.location, index, self.source]).encode()).hexdigest()[:32]
        self.table = dataset.kept_in() / CACHE_FOLDER / f"{name}.docs"
        self._map: mmap.mmap | None = None
        self._offsets: np.ndarray | None = None
        if not self.table.exists():
            self._make_table()
        self.token_starts = self.offsets()[self.doc_starts].astype(np.int64)

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
        finally:
            os.close(fd)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_map"], state["_offsets"], state["_encoded"], state["_encoded_ids"] = None, None, OrderedDict(), 0  # each process its own
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
        for n, (part, row, first, size, start, count, dest, more) in enumerate(zip(
                parts.tolist(), rows.tolist(), firsts.tolist(), sizes.tolist(), segments.start.tolist(), counts.tolist(),
                destinations.tolist(), extra.tolist())):
            reader = _reader(self.dataset, part)
            ids = self._ids(reader, part, row)
            if len(ids) != size:
                raise ShardError(f"{reader.key(row)}: holds {len(ids)} ids in column {self.field!r}, the document table "
                                 f"{size} (the file changed since it was indexed?)")
            buffer[dest : dest + count] = ids[start - first : start - first + count]
            if more:
                nexts[n] = buffer[dest + count - 1]
        end = int((destinations + segments.length).max(initial=0))
        highest = MAX_ID if self.vocab_size is None else self.vocab_size - 1
        if min(int(buffer[:end].min(initial=0)), int(nexts.min(initial=0))) < 0 or max(int(buffer[:end].max(initial=0)), int(nexts.max(initial=0))) > highest:
            for part, row, first, start, count in zip(parts.tolist(), rows.tolist(), firsts.tolist(), segments.start.tolist(), counts.tolist()):
                reader = _reader(self.dataset, part)  # the row holding a bad id named: read again (an error's path)
                reader.check_ids(row, self.field, self._ids(reader, part, row)[start - first : start - first + count], self.vocab_size)
        return nexts

    def _ids(self, reader: InPlaceReader, part: int, row: int) -> np.ndarray:
        """Row ``row``'s ids (of part ``part``, read by ``reader``): its list, or its text encoded (the last
        ENCODED_TOKENS ids encoded kept: a document cut across rows is encoded once)."""
        if self.encoder is None:
            return reader.list_values(row, self.field)
        ids = self._encoded.get((part, row))
        if ids is None:
            assert self.encoder is not None
            ids = self._encoded[(part, row)] = text_ids(self.encoder, reader, row, self.field)
            self._encoded_ids += len(ids)
            while self._encoded_ids > ENCODED_TOKENS and len(self._encoded) > 1:
                self._encoded_ids -= len(self._encoded.popitem(last=False)[1])
        self._encoded.move_to_end((part, row))
        return ids

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

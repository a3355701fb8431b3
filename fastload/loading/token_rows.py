"""Which token spans each row of an epoch holds, for the three packing modes, read from a token
dataset's document tables (memory-mapped) and the pure orders of fastload.text.

A row is a list of :class:`Segment` s: a run of one document's tokens (``start``: its first
global token), and whether that document goes on after it (then the segment's last label is the
document's next token; otherwise, as across documents, the ignore index).

- ``concat``: row k is tokens ``k*L .. (k+1)*L`` of the epoch's stream (fastload.text.token_order);
- ``best-fit``: each block's pieces packed by best-fit decreasing (fastload.text.packing), blocks
  in stream order: row numbers run on from block to block, so finding row k packs the blocks
  before it; :class:`BestFitRows` keeps a cursor (the block holding the next row and its first
  row), which ``state_dict`` saves, so a resume never packs from the epoch's start;
- ``pad``: row k is the k-th document of a seeded permutation of all documents, its first L tokens.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import Enum

import numpy as np

from fastload.formats.tokens import TokenShardReader
from fastload.orders.permutation import Permutation, mix_key
from fastload.storage.dataset import ShardedDataset
from fastload.text.packing import best_fit_decreasing, split_long
from fastload.text.token_order import ROW_KEY, TokenStream, block_pieces


class Packing(Enum):
    """How documents become rows of ``seq_len`` tokens."""

    CONCAT = "concat"
    BEST_FIT = "best-fit"
    PAD = "pad"


@dataclass(frozen=True)
class Segment:
    """A run of one document's tokens in a row."""

    start: int  # its first token in the dataset's global token space
    length: int
    continues: bool  # the document has a next token after it (the segment's last label)


Row = list[Segment]


class TokenCorpus:
    """A token dataset's global token space: shards concatenated, read span by span."""

    def __init__(self, dataset: ShardedDataset) -> None:
        if dataset.index.tokenizer is None:
            raise ValueError(f"{dataset.location} holds no tokens (convert documents with --tokenizer)")
        self.dataset = dataset
        self.tokenizer = dataset.index.tokenizer
        self.token_starts = np.array(list(itertools.accumulate((s.tokens or 0 for s in dataset.index.shards), initial=0)), dtype=np.int64)
        self.doc_starts = np.array(list(itertools.accumulate((s.samples for s in dataset.index.shards), initial=0)), dtype=np.int64)

    @property
    def total(self) -> int:
        """Tokens in the dataset."""
        return int(self.token_starts[-1])

    @property
    def documents(self) -> int:
        """Documents in the dataset."""
        return int(self.doc_starts[-1])

    def reader(self, shard: int) -> TokenShardReader:
        """Shard ``shard``'s reader, open in this process."""
        reader = self.dataset.reader(shard)
        assert isinstance(reader, TokenShardReader)  # a token dataset's layout opens token readers
        return reader

    def shard_of(self, token: int) -> int:
        """The shard holding global token ``token``."""
        return int(np.searchsorted(self.token_starts, token, side="right") - 1)

    def starts_inside(self, start: int, end: int) -> np.ndarray:
        """Global positions of the documents starting strictly between ``start`` and ``end``."""
        found = []
        first, last = self.shard_of(start), self.shard_of(max(end - 1, start))
        for shard in range(first, last + 1):
            base = int(self.token_starts[shard])
            offsets = self.reader(shard).offsets()
            lo = int(np.searchsorted(offsets, max(start - base, 0), side="right"))
            hi = int(np.searchsorted(offsets, end - base, side="left"))
            if hi > lo:
                part = self.reader(shard).checked_offsets(lo, hi - 1) + base
                found.append(part[(part > start) & (part < end)])
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def starts_document(self, token: int) -> bool:
        """Whether a document starts at global token ``token`` (the end of the tokens: no next token, so True)."""
        if token >= self.total:
            return True
        shard = self.shard_of(token)
        local = token - int(self.token_starts[shard])
        offsets = self.reader(shard).offsets()
        at = int(np.searchsorted(offsets, local, side="left"))
        return at < len(offsets) and int(offsets[at]) == local

    def read(self, start: int, count: int) -> np.ndarray:
        """Global tokens ``start`` to ``start + count`` (within one shard: a document's), one ``pread``."""
        shard = self.shard_of(start)
        return self.reader(shard).read_tokens(start - int(self.token_starts[shard]), count)

    def document(self, index: int) -> tuple[int, int, int, int]:
        """(shard, document number in it, its first global token, its length) of document ``index``."""
        shard = int(np.searchsorted(self.doc_starts, index, side="right") - 1)
        row = index - int(self.doc_starts[shard])
        first, end = self.reader(shard).bounds(row)
        return shard, row, int(self.token_starts[shard]) + first, end - first

    def where(self, token: int) -> tuple[str, int]:
        """(shard file, document number in it) holding global token ``token``."""
        shard = self.shard_of(token)
        local = token - int(self.token_starts[shard])
        row = int(np.searchsorted(self.reader(shard).offsets(), local, side="right") - 1)
        return self.dataset.index.shards[shard].path, row


class StreamRows:
    """The epoch's stream (concat mode) cut into rows of ``seq_len``."""

    def __init__(self, corpus: TokenCorpus, seq_len: int, block: int, seed: int, epoch: int, shuffle: bool) -> None:
        self.corpus, self.seq_len = corpus, seq_len
        self.stream = TokenStream(corpus.total, block, seed, epoch, shuffle)
        self._pieces: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return -(-self.corpus.total // self.seq_len)

    def block(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Block ``index`` of the stream: its pieces' first tokens, lengths, ends in the block and
        whether each one's document goes on after it (only the piece at the block's end may; the
        last few blocks cached)."""
        cached = self._pieces.get(index)
        if cached is None:
            number, start, length = self.stream.block_span(index)
            starts, lengths = block_pieces(self.stream, number, start, length, self.corpus.starts_inside(start, start + length))
            continues = np.zeros(len(starts), dtype=bool)
            continues[starts + lengths == start + length] = not self.corpus.starts_document(start + length)
            cached = (starts, lengths, np.cumsum(lengths), continues)
            if len(self._pieces) >= 8:
                self._pieces.pop(next(iter(self._pieces)))
            self._pieces[index] = cached
        return cached

    def row(self, k: int) -> Row:
        """Row ``k``: stream tokens ``k*seq_len`` up to ``(k+1)*seq_len`` (fewer in the last row)."""
        block = self.stream.block
        position, end = k * self.seq_len, min((k + 1) * self.seq_len, self.corpus.total)
        segments: Row = []
        while position < end:
            index = position // block
            starts, lengths, ends, continues = self.block(index)
            offset = position - index * block
            piece = int(np.searchsorted(ends, offset, side="right"))
            into = offset - int(ends[piece] - lengths[piece])
            take = min(int(lengths[piece]) - into, end - position)
            last_of_piece = into + take == int(lengths[piece])
            segments.append(Segment(int(starts[piece]) + into, take, not last_of_piece or bool(continues[piece])))
            position += take
        return segments


class PaddedRows:
    """One document a row (pad mode), documents in a seeded order, each cut to ``seq_len``."""

    def __init__(self, corpus: TokenCorpus, seq_len: int, seed: int, epoch: int, shuffle: bool) -> None:
        self.corpus, self.seq_len = corpus, seq_len
        self.permutation = Permutation(corpus.documents, mix_key(seed, epoch, ROW_KEY), shuffle)

    def __len__(self) -> int:
        return self.corpus.documents

    def row(self, k: int) -> Row:
        """Row ``k``: its document's first ``seq_len`` tokens."""
        _, _, start, length = self.corpus.document(int(self.permutation(np.array([k]))[0]))
        take = min(length, self.seq_len)
        return [Segment(start, take, take < length)]


class BestFitRows:
    """Rows packed by best-fit decreasing, a block of the stream at a time; ``cursor`` is the block
    holding the rows asked for last and the number of its first row."""

    def __init__(self, corpus: TokenCorpus, seq_len: int, block: int, seed: int, epoch: int, shuffle: bool,
                 cursor: tuple[int, int] = (0, 0)) -> None:
        self.corpus, self.seq_len = corpus, seq_len
        self.stream = StreamRows(corpus, seq_len, block, seed, epoch, shuffle)
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        self.cursor = cursor
        self._rows: dict[int, list[Row]] = {}  # packed blocks at and after the cursor

    def block_rows(self, index: int, keep: bool = True) -> list[Row]:
        """The rows packed from block ``index`` of the stream, in their seeded order (``keep``: cached)."""
        rows = self._rows.get(index)
        if rows is None:
            starts, lengths, _, piece_continues = self.stream.block(index)
            ends, goes_on = starts + lengths, starts[piece_continues] + lengths[piece_continues]
            starts, lengths = split_long(starts, lengths, self.seq_len)
            continues = ~np.isin(starts + lengths, ends) | np.isin(starts + lengths, goes_on)
            packed = best_fit_decreasing(lengths, self.seq_len)
            number = self.stream.stream.block_span(index)[0]
            order = Permutation(len(packed), mix_key(self.seed, self.epoch, ROW_KEY, number), self.shuffle)(np.arange(len(packed)))
            rows = [[Segment(int(starts[p]), int(lengths[p]), bool(continues[p])) for p in packed[r]] for r in order.tolist()]
            if keep:
                self._rows[index] = rows
        return rows

    def row(self, k: int) -> Row | None:
        """Row ``k`` of the epoch (None past its end), packing forward from the cursor (and from
        the epoch's start, for a row before it)."""
        index, first = self.cursor if k >= self.cursor[1] else (0, 0)
        blocks = self.stream.stream.blocks
        while index < blocks:
            rows = self.block_rows(index)
            if k < first + len(rows):
                if k >= self.cursor[1]:
                    self._advance(index, first)
                return rows[k - first]
            index, first = index + 1, first + len(rows)
        return None

    def _advance(self, index: int, first: int) -> None:
        """Move the cursor to block ``index`` (whose first row is ``first``), forgetting the blocks before it."""
        self.cursor = (index, first)
        for done in [i for i in self._rows if i < index]:
            del self._rows[done]

    def count(self) -> int:
        """Rows in the whole epoch (packs every block: for ``len()``, not for iteration)."""
        return sum(len(self.block_rows(index, keep=False)) for index in range(self.stream.stream.blocks))

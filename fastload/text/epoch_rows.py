"""The rows of one epoch of a token dataset, for each packing mode and mixtures by tokens, as NumPy
arrays (:class:`Segments`) computed for a whole batch at once (fastload.text.token_rows chooses
the mode and does the epoch's arithmetic: lengths, resumes, ranks).

A segment is a run of one document's tokens in a row (``start``: its first global token), and
whether that document goes on after it (then the segment's last label is the document's next
token; otherwise, as across documents, the ignore index). A row's segments lie back to back from
its first column; what is left of the row is padding.

- ``concat``: row k is tokens ``k*L .. (k+1)*L`` of the epoch's stream (fastload.text.token_order);
  after a resume at another seq_len, rows from the resume's row C on are cut from the stream's
  token T where the rows before it ended (the *origin* (C, T)): row k is tokens ``T + (k-C)*L ..``;
- ``best-fit``: the pieces of each window of the stream (``packing_window`` tokens: whole blocks,
  in stream order) packed by best-fit decreasing (fastload.text.packing), windows one after
  another: row numbers run on from window to window, so finding row k needs the row counts of the
  windows before it; :class:`BestFitRows` locates rows forward from a cursor (the window holding
  a row and that window's first row), which ``state_dict`` saves, so a resume never counts from
  the epoch's start. After a resume at another seq_len at row C (a :class:`Boundary`), the rows
  before C stay as they were cut; the pieces of C's window that rows before C did not hold (its
  *remnant*) are packed anew at the new seq_len as rows from C on, then the later windows at the
  new seq_len: each token of the epoch in exactly one row, none lost, none repeated;
- ``pad``: row k is the k-th document of a seeded permutation of all documents, its first L tokens;
- a mixture by tokens (:class:`MixtureRows`): row k from the member :func:`mixture_members` gives
  it, each member's rows cut from its stream of epochs one after another, so every row is L
  tokens of one member and each member's share of tokens is its share of rows.
"""

from __future__ import annotations

import bisect
import itertools
from typing import NamedTuple

import numpy as np

from fastload.orders.mixing import member_seed, mixture_members
from fastload.orders.permutation import Permutation, mix_key
from fastload.storage.mixed_dataset import MixedDataset
from fastload.text.packing import best_fit_decreasing, best_fit_rows, split_lengths, split_long
from fastload.text.token_corpus import MixtureCorpus, Segments, TokenCorpus
from fastload.text.token_order import ROW_KEY, TokenStream, block_pieces

BLOCKS_KEPT = 8  # a stream's most recent blocks kept (their pieces)
WINDOWS_KEPT = 2  # best-fit's most recent windows kept (their packed rows)
SCHEDULE_PART = 1 << 22  # a mixture's weight schedule by tokens: the weights held over parts of at most this many tokens


def cut_into_rows(starts: np.ndarray, lengths: np.ndarray, continues: np.ndarray, seq_len: int) -> Segments:
    """Pieces laid back to back from the start of row 0, cut wherever a row of ``seq_len`` ends
    (a piece cut there goes on in the next row: its part before the cut continues)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths
    first_row, last_row = offsets // seq_len, (offsets + lengths - 1) // seq_len
    parts = np.maximum(last_row - first_row + 1, 0)
    owner = np.repeat(np.arange(len(lengths)), parts)
    row = first_row[owner] + np.arange(len(owner)) - np.repeat(np.cumsum(parts) - parts, parts)
    begin = np.maximum(offsets[owner], row * seq_len)
    end = np.minimum(offsets[owner] + lengths[owner], (row + 1) * seq_len)
    goes_on = np.where(end < offsets[owner] + lengths[owner], True, continues[owner])
    return Segments(starts[owner] + begin - offsets[owner], end - begin, goes_on, row)


class StreamRows:
    """The epoch's stream (concat mode) cut into rows of ``seq_len``, from ``origin`` (a row and its first
    token of the stream: rows from that row on; (0, 0) but after a resume at another seq_len)."""

    def __init__(self, corpus: TokenCorpus, seq_len: int, block: int, seed: int, epoch: int, shuffle: bool,
                 origin: tuple[int, int] = (0, 0)) -> None:
        self.corpus, self.seq_len, self.origin = corpus, seq_len, origin
        self.stream = TokenStream(corpus.total, block, seed, epoch, shuffle)
        self._pieces: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._spans: dict[int, tuple[int, int, int]] = {}

    def __len__(self) -> int:
        row, token = self.origin
        return row + -(-max(0, self.corpus.total - token) // self.seq_len)

    def block_span(self, index: int) -> tuple[int, int, int]:
        """(block number, first global token, tokens) of block ``index`` of the stream (the last few kept)."""
        span = self._spans.get(index)
        if span is None:
            span = self.stream.block_span(index)
            if len(self._spans) >= BLOCKS_KEPT:
                self._spans.pop(next(iter(self._spans)))
            self._spans[index] = span
        return span

    def block(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Block ``index`` of the stream: its pieces' first tokens, lengths, ends in the block and
        whether each one's document goes on after it (only the piece at the block's end may; the
        last few blocks kept)."""
        cached = self._pieces.get(index)
        if cached is None:
            number, start, length = self.block_span(index)
            starts, lengths = block_pieces(self.stream, number, start, length, self.corpus.starts_inside(start, start + length))
            continues = np.zeros(len(starts), dtype=bool)
            continues[starts + lengths == start + length] = not self.corpus.starts_document(start + length)
            cached = (starts, lengths, np.cumsum(lengths), continues)
            if len(self._pieces) >= BLOCKS_KEPT:
                self._pieces.pop(next(iter(self._pieces)))
            self._pieces[index] = cached
        return cached

    def span(self, begin: int, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pieces of stream tokens ``begin`` to ``end`` in stream order, the first and last cut
        to fit: (first global tokens, lengths, whether each one's document goes on after it)."""
        block = self.stream.block
        parts = []
        for index in range(begin // block, -(-end // block)):
            starts, lengths, ends, continues = self.block(index)
            lo, hi = max(begin - index * block, 0), min(end - index * block, int(ends[-1]))
            first, last = int(np.searchsorted(ends, lo, side="right")), int(np.searchsorted(ends, hi, side="left"))
            starts, lengths, ends, continues = starts[first : last + 1], lengths[first : last + 1], ends[first : last + 1], continues[first : last + 1]
            into = lo - (int(ends[0]) - int(lengths[0]))  # tokens of the first piece before the span
            cut = int(ends[-1]) - hi  # tokens of the last piece after it
            starts, lengths, continues = starts.copy(), lengths.copy(), continues.copy()
            starts[0] += into
            lengths[0] -= into
            lengths[-1] -= cut
            if cut:
                continues[-1] = True
            parts.append((starts, lengths, continues))
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
        starts, lengths, continues = (np.concatenate(column) for column in zip(*parts))
        return starts, lengths, continues

    def shards(self, first: int, count: int) -> np.ndarray:
        """The shards reading rows ``first`` to ``first + count`` opens, in reading order, from the
        index alone: those of the stream's blocks they are cut from (a block's document starts are read whole)."""
        row, token = self.origin
        begin, end = token + (first - row) * self.seq_len, min(token + (first + count - row) * self.seq_len, self.corpus.total)
        return self.blocks_shards(begin, end)

    def blocks_shards(self, begin: int, end: int) -> np.ndarray:
        """The shards of the blocks holding stream tokens ``begin`` to ``end``, in stream order (none when the span is empty)."""
        block = self.stream.block
        starts, sizes = self.stream.block_spans(begin // block, -(-end // block)) if begin < end else (np.zeros(0, dtype=np.int64),) * 2
        return self.corpus.shards_spanned(starts, starts + sizes)

    def segments(self, first: int, count: int) -> Segments:
        """Rows ``first`` (not before the origin's row) to ``first + count`` (past the stream's end: empty), rows numbered from 0."""
        row, token = self.origin
        begin, end = token + (first - row) * self.seq_len, min(token + (first + count - row) * self.seq_len, self.corpus.total)
        if begin >= end:
            return Segments.join([])
        return cut_into_rows(*self.span(begin, end), self.seq_len)


class PaddedRows:
    """One document a row (pad mode), documents in a seeded order, each cut to ``seq_len``."""

    def __init__(self, corpus: TokenCorpus, seq_len: int, seed: int, epoch: int, shuffle: bool) -> None:
        self.corpus, self.seq_len = corpus, seq_len
        self.permutation = Permutation(corpus.documents, mix_key(seed, epoch, ROW_KEY), shuffle)

    def __len__(self) -> int:
        return self.corpus.documents

    def shards(self, first: int, count: int) -> np.ndarray:
        """The shards of rows ``first`` to ``first + count``'s documents, in row order, from the index alone."""
        rows = np.arange(first, min(first + count, len(self)), dtype=np.int64)
        return np.searchsorted(self.corpus.doc_starts, self.permutation(rows), side="right") - 1

    def segments(self, first: int, count: int) -> Segments:
        """Rows ``first`` to ``first + count`` (past the last document: empty): each its document's first ``seq_len`` tokens."""
        rows = np.arange(first, min(first + count, len(self)), dtype=np.int64)
        starts, lengths = self.corpus.documents_at(self.permutation(rows))
        take = np.minimum(lengths, self.seq_len)
        keep = take > 0
        return Segments(starts[keep], take[keep], (take < lengths)[keep], (rows - first)[keep])


class Boundary(NamedTuple):
    """Where an epoch's best-fit rows of one seq_len give way to rows of another (a resume at another
    seq_len): at row ``row``, which the rows before, cut at ``seq_len``, hold in window ``window``
    whose first row is ``first`` (``window`` past the epoch's windows: ``row`` ends the rows before)."""

    row: int
    seq_len: int
    window: int
    first: int


class BestFitRows:
    """Rows packed by best-fit decreasing, a window of ``window`` consecutive blocks of the stream
    at a time; ``counts`` holds each window's rows as counted, ``firsts`` the first row of windows
    ``base`` onwards, as far as located. With an ``origin`` (the :class:`Boundary` of each resume at
    another seq_len, the last one this ``seq_len``'s), these are the rows from the last boundary's
    row on: first its window's remnant, then the later windows; rows before it are not theirs."""

    def __init__(self, corpus: TokenCorpus, seq_len: int, block: int, window: int, seed: int, epoch: int, shuffle: bool,
                 cursor: tuple[int, int] | None = None, origin: tuple[Boundary, ...] = ()) -> None:
        self.corpus, self.seq_len, self.window, self.block = corpus, seq_len, window, block
        self.stream = StreamRows(corpus, seq_len, block, seed, epoch, shuffle)
        self.windows = -(-self.stream.stream.blocks // window)
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        self.origin = origin
        self.start = (origin[-1].window, origin[-1].row) if origin else (0, 0)  # the first window of these rows and its first row
        self.counts: dict[int, int] = {}
        base, first = cursor if cursor is not None else self.start
        self.base, self.firsts = base, [first]
        self._packed: dict[int, Segments] = {}
        self._previous: BestFitRows | None = None
        self._remnant: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def previous(self) -> BestFitRows:
        """The rows before the last boundary (cut at its seq_len), located from the window holding it."""
        if self._previous is None:
            last = self.origin[-1]
            self._previous = BestFitRows(self.corpus, last.seq_len, self.block, self.window, self.seed, self.epoch, self.shuffle,
                                         (last.window, last.first), self.origin[:-1])
        return self._previous

    def _window_pieces(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Window ``index``'s pieces before any is cut to a row: its blocks' in stream order (first tokens,
        lengths, whether each one's document goes on past its block); the last boundary's window: the pieces
        the rows before the boundary's row did not hold, as packed at the seq_len before."""
        if self.origin and index == self.start[0]:
            if self._remnant is None:
                last = self.origin[-1]
                rows = self.previous().window_rows(last.window)
                left = rows.row >= last.row - last.first
                self._remnant = rows.start[left], rows.length[left], rows.continues[left]
            return self._remnant
        blocks = [self.stream.block(b) for b in range(index * self.window, min((index + 1) * self.window, self.stream.stream.blocks))]
        return tuple(np.concatenate([b[column] for b in blocks]) for column in (0, 1, 3))  # type: ignore[return-value]

    def _pieces(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Window ``index``'s pieces (:meth:`_window_pieces`), those longer than a row cut into
        row-long parts: first tokens, lengths, whether each goes on (in its next part, or past its piece)."""
        starts, lengths, piece_continues = self._window_pieces(index)
        parts, part_lengths, owner = split_long(starts, lengths, self.seq_len)
        return parts, part_lengths, (parts + part_lengths < (starts + lengths)[owner]) | piece_continues[owner]

    def _piece_lengths(self, index: int) -> np.ndarray:
        """The lengths of window ``index``'s pieces, as :meth:`_pieces` cuts them, in no order (a
        block's pieces are its documents cut at its edges: their order within it is not needed)."""
        if self.origin and index == self.start[0]:
            return split_lengths(self._window_pieces(index)[1], self.seq_len)
        lengths = []
        starts, sizes = self.stream.stream.block_spans(index * self.window, min((index + 1) * self.window, self.stream.stream.blocks))
        for start, end in zip(starts.tolist(), (starts + sizes).tolist()):
            lengths.append(np.diff(np.concatenate([[start], self.corpus.starts_inside(start, end), [end]])))
        return split_lengths(np.concatenate(lengths), self.seq_len)

    def window_shards(self, index: int) -> np.ndarray:
        """The shards packing window ``index`` opens (its blocks'), in stream order, from the index alone."""
        stream = self.stream.stream
        return self.stream.blocks_shards(index * self.window * stream.block, min((index + 1) * self.window * stream.block, stream.total))

    def count(self, index: int) -> int:
        """Rows packed from window ``index`` (counted without packing it)."""
        if index not in self.counts:
            self.counts[index] = best_fit_rows(self._piece_lengths(index), self.seq_len)
        return self.counts[index]

    def window_rows(self, index: int) -> Segments:
        """Window ``index``'s rows, in their seeded order (numbered from 0; the last couple of windows kept)."""
        packed = self._packed.get(index)
        if packed is None:
            starts, lengths, continues = self._pieces(index)
            rows = best_fit_decreasing(lengths, self.seq_len)
            order = Permutation(len(rows), mix_key(self.seed, self.epoch, ROW_KEY, index), self.shuffle)(np.arange(len(rows))).tolist()
            pieces = np.fromiter(itertools.chain.from_iterable(rows[r] for r in order), dtype=np.int64, count=len(lengths))
            row_of = np.repeat(np.arange(len(rows)), [len(rows[r]) for r in order])
            packed = Segments(starts[pieces], lengths[pieces], continues[pieces], row_of)
            self.counts[index] = len(rows)
            if len(self._packed) >= WINDOWS_KEPT:
                self._packed.pop(next(iter(self._packed)))
            self._packed[index] = packed
        return packed

    def locate(self, k: int) -> tuple[int, int] | None:
        """(window, its first row) of the window holding row ``k`` (None past the epoch's end),
        counting forward from the windows located so far (from these rows' start for a row before them; a row
        before that, an earlier seq_len's: None)."""
        if k < self.firsts[0]:
            if k < self.start[1]:  # before these rows (an earlier seq_len's)
                return None
            self.base, self.firsts = self.start[0], [self.start[1]]
        while k >= self.firsts[-1] and self.base + len(self.firsts) - 1 < self.windows:
            self.firsts.append(self.firsts[-1] + self.count(self.base + len(self.firsts) - 1))
        at = bisect.bisect_right(self.firsts, k) - 1
        if at == len(self.firsts) - 1:  # past the last window's rows
            return None
        return self.base + at, self.firsts[at]

    def segments(self, first: int, count: int, cursor: tuple[int, int] | None) -> Segments:
        """Rows ``first`` to ``first + count`` (past the epoch's end: empty), rows numbered from 0;
        ``cursor``: the window holding row ``first`` and its first row (else located here)."""
        cursor = cursor if cursor is not None else self.locate(first)
        if cursor is None:
            return Segments.join([])
        index, window_first = cursor
        parts = []
        while index < self.windows and window_first < first + count:
            rows = self.window_rows(index)
            lo, hi = max(first - window_first, 0), min(first + count - window_first, self.counts[index])
            take = (rows.row >= lo) & (rows.row < hi)
            parts.append(Segments(rows.start[take], rows.length[take], rows.continues[take], rows.row[take] + window_first - first))
            index, window_first = index + 1, window_first + self.counts[index]
        return Segments.join(parts)

    def plausible_first(self, index: int, first: int) -> bool:
        """Whether window ``index`` may start at row ``first``: the windows before it (full, ``T``
        tokens) pack into at least ``T / seq_len`` rows and, as best fit leaves at most one row of a
        window at most half full, fewer than ``2 T / seq_len + 1`` each (from these rows' first window
        on, its remnant at most a window's tokens)."""
        start_window, start_row = self.start
        if index <= start_window:
            return index == start_window and first == start_row
        tokens = self.window * self.stream.stream.block
        before = (index - start_window - (1 if self.origin else 0)) * tokens  # the remnant may hold nothing
        return start_row + -(-before // self.seq_len) <= first <= start_row + 2 * (index - start_window) * tokens // self.seq_len + index - start_window

    def seek(self, index: int, first: int) -> None:
        """Locate rows from window ``index``, whose first row is ``first`` (a saved cursor, checked by the caller)."""
        self.base, self.firsts = index, [first]

    def check_origin(self) -> None:
        """A ValueError naming ``resumed_from`` unless each boundary's window holds its row among the rows before it
        (a boundary past the last window: unless its row is the end of the rows before)."""
        if not self.origin:
            return
        last, previous = self.origin[-1], self.previous()
        previous.check_origin()
        if last.window >= self.windows:
            if previous.total() != last.row:
                raise ValueError(f"loader state: resumed_from's entry at samples_consumed={last.row} (seq_len={last.seq_len}) names no "
                                 f"best-fit window, but epoch {self.epoch} holds {previous.total()} rows at that seq_len: save it with its packing_cursor")
        elif not (previous.plausible_first(last.window, last.first) and last.first <= last.row < last.first + previous.count(last.window)):
            raise ValueError(f"loader state: resumed_from's entry at samples_consumed={last.row} (seq_len={last.seq_len}) names best-fit "
                             f"window {last.window} from row {last.first}, which cannot hold that row")

    def held(self, first: int, count: int) -> int:
        """How many of rows ``first`` to ``first + count`` the epoch holds (past its last row, every window is counted)."""
        if self.locate(first + count - 1) is not None:
            return count
        return max(0, min(count, self.firsts[-1] - first))

    def total(self) -> int:
        """Rows in the whole epoch (every window counted, once: for ``len()``; after a resume at another seq_len,
        the rows before it and those counted from it)."""
        return self.start[1] + sum(self.count(index) for index in range(self.start[0], self.windows))


class MixtureRows:
    """Rows of a mixture by tokens: row k from the member :func:`mixture_members` gives it (an
    epoch is ``length`` rows of the endless schedule); a member's j-th row is tokens ``j*L`` to
    ``(j+1)*L`` of its epochs' streams one after another (each epoch with the member's own seed),
    so every row is L tokens of one member."""

    def __init__(self, mixture: MixedDataset, corpus: MixtureCorpus, seq_len: int, block: int, seed: int, epoch: int, shuffle: bool) -> None:
        self.mixture, self.seq_len, self.block, self.seed, self.epoch, self.shuffle = mixture, seq_len, block, seed, epoch, shuffle
        self.corpora = corpus.members
        self.bases = corpus.bases.tolist()
        self.length = sum(c.total for c in self.corpora) // seq_len
        self._streams: dict[tuple[int, int], StreamRows] = {}

    def __len__(self) -> int:
        return self.length

    def _stream(self, member: int, epoch: int) -> StreamRows:
        """Member ``member``'s stream of its epoch ``epoch`` (each member's latest kept)."""
        stream = self._streams.get((member, epoch))
        if stream is None:
            stream = StreamRows(self.corpora[member], self.seq_len, self.block, member_seed(self.seed, member), epoch, self.shuffle)
            self._streams = {key: s for key, s in self._streams.items() if key[0] != member}
            self._streams[(member, epoch)] = stream
        return stream

    def members(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Each of rows ``first`` to ``first + count`` (within the epoch): its member and its row number in that member's rows."""
        rows = np.arange(first, min(first + count, self.length), dtype=np.int64)
        if self.mixture.schedule is not None:  # weights by the tokens of the run so far, in parts of at most SCHEDULE_PART tokens
            return self.mixture.schedule.parts(self.seq_len, SCHEDULE_PART).members(self.epoch * self.length + rows, self.seed, False)
        return mixture_members(self.epoch * self.length + rows, self.mixture.weights)

    def weights_at(self, row: int) -> tuple[float, ...]:
        """The members' weights in force at row ``row`` of the epoch (summing to 1)."""
        if self.mixture.schedule is not None:
            return self.mixture.schedule.weights_at((self.epoch * self.length + row) * self.seq_len)
        return tuple(w / sum(self.mixture.weights) for w in self.mixture.weights)

    def segments(self, first: int, count: int) -> Segments:
        """Rows ``first`` to ``first + count`` (past the epoch's end: empty), rows numbered from 0,
        in the mixture's global token space; consecutive rows of one member read as one run."""
        members, local = self.members(first, count)
        parts = []
        run = 0
        while run < len(members):
            member, j = int(members[run]), int(local[run])
            end = run + 1
            while end < len(members) and members[end] == member and local[end] == j + end - run:
                end += 1
            parts.append(self._member_rows(member, j, end - run).shifted(self.bases[member], run))
            run = end
        return Segments.join(parts)

    def shards(self, first: int, count: int) -> np.ndarray:
        """The shards (numbered across the members) reading rows ``first`` to ``first + count`` opens, in reading order, from the index alone."""
        members, local = self.members(first, count)
        found = [np.zeros(0, dtype=np.int64)]
        for member, row in zip(members.tolist(), local.tolist()):
            corpus, begin, end = self.corpora[member], row * self.seq_len, (row + 1) * self.seq_len
            while begin < end:
                epoch, into = divmod(begin, corpus.total)
                take = min(end - begin, corpus.total - into)
                stream = StreamRows(corpus, self.seq_len, self.block, member_seed(self.seed, member), epoch, self.shuffle)  # not the kept ones: another thread asks
                found.append(stream.blocks_shards(into, into + take) + self.mixture.first_shards[member])
                begin += take
        return np.concatenate(found)

    def _member_rows(self, member: int, first: int, count: int) -> Segments:
        """Member ``member``'s rows ``first`` to ``first + count``, across its epochs, rows from 0."""
        total, begin, end = self.corpora[member].total, first * self.seq_len, (first + count) * self.seq_len
        starts, lengths, continues = [], [], []
        while begin < end:
            epoch, into = divmod(begin, total)
            take = min(end - begin, total - into)
            piece = self._stream(member, epoch).span(into, into + take)
            starts.append(piece[0])
            lengths.append(piece[1])
            continues.append(piece[2])
            begin += take
        return cut_into_rows(np.concatenate(starts), np.concatenate(lengths), np.concatenate(continues), self.seq_len)


def refuse_members_shorter_than_a_row(corpus: MixtureCorpus, seq_len: int) -> None:
    """A ValueError naming the first member of a mixture by tokens that holds fewer than ``seq_len``
    tokens: each of its rows would be that many of its epochs, one after another."""
    for number, member in enumerate(corpus.members):
        tokens = member.total
        if tokens < seq_len:
            raise ValueError(f"mix: member {number} ({member.dataset.location}) holds {tokens} tokens, fewer than a row of seq_len={seq_len}: "
                             f"each of its rows would repeat it {-(-seq_len // max(tokens, 1))} times over; give it more documents or leave it out")

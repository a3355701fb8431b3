"""A token loader's rows: its options (``seq_len``, packing, block and window sizes), the packing
mode's rows of each epoch (fastload.text.epoch_rows: which token spans each row holds) and the
epoch's arithmetic over them that iteration, ``len()``, the samplers, ``describe`` and resume all
use: an epoch's length, where a resume continues (best-fit's cursor; after a resume at another
``seq_len``, the *origin*: concat's (C, T), rows from row C on cut from the stream's token T;
best-fit's :class:`~fastload.text.epoch_rows.Boundary` of each such resume, each naming the window
holding its row, which a state records in its ``resumed_from`` entry), and the rows of each rank in a global step
(:meth:`TokenRows.step_batch`, the one function iteration, the run-ahead, the samplers and, at a global step's
segment, ``describe`` (:meth:`TokenRows.batch_at`) make a batch from)."""

from __future__ import annotations

import numbers
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

import numpy as np

from fastload.orders.steps import step_at
from fastload.storage.dataset import ShardedDataset
from fastload.storage.mixed_dataset import MixedDataset
from fastload.text.column_corpus import ColumnCorpus
from fastload.text.epoch_rows import BestFitRows, Boundary, MixtureRows, PaddedRows, StreamRows, refuse_members_shorter_than_a_row
from fastload.text.token_corpus import MixtureCorpus, Segments, ShardCorpus, TokenCorpus
from fastload.text.tokenizer import TextTokenizer

BLOCK_TOKENS = 1 << 16  # the stream's blocks: documents are shuffled within one, blocks within the epoch
PACKING_WINDOW = 1 << 22  # best-fit's window: on the Debian text of benchmarks/bench_tokens.py, 0.8% padding at L = 2048 (10% a block)
IGNORE_INDEX = -100  # what torch's cross_entropy and Hugging Face models ignore in labels
E = TypeVar("E", bound=Enum)


def choice(kind: type[E], value: object, name: str) -> E:
    """``value`` as a member of the enum ``kind`` (a member or its value), else a ValueError listing them."""
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {', '.join(repr(m.value) for m in kind)}, got {value!r}") from None


class Packing(Enum):
    """How documents become rows of ``seq_len`` tokens."""

    CONCAT = "concat"
    BEST_FIT = "best-fit"
    PAD = "pad"


@dataclass(frozen=True)
class TokenOptions:
    """What rows are made of: their length, the packing, the stream's block size, the ignore index."""

    seq_len: int
    packing: Packing = Packing.CONCAT
    block_tokens: int = BLOCK_TOKENS
    ignore_index: int = IGNORE_INDEX
    packing_window: int = PACKING_WINDOW  # best-fit: tokens packed at once (whole blocks of the stream, at least one)
    field: str | None = None  # data read in place: the column holding each row's document (None: input_ids)
    tokenizer: str | None = None  # data read in place: the tokenizer of its ids (pad, eos, vocabulary), which encodes a text column

    def __post_init__(self) -> None:
        for name in ("seq_len", "block_tokens", "packing_window", "ignore_index"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or (name != "ignore_index" and value < 1):
                raise ValueError(f"{name} must be a {'whole' if name == 'ignore_index' else 'positive'} number of tokens, got {value!r}")
            object.__setattr__(self, name, int(value))  # a NumPy integer too
        object.__setattr__(self, "packing", choice(Packing, self.packing, "packing"))
        for name in ("field", "tokenizer"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be {'a column name' if name == 'field' else 'a tokenizer file or folder'}, got {value!r}")
        if self.packing_window < self.seq_len and self.packing is Packing.BEST_FIT:
            raise ValueError("best-fit packs a window of the stream at a time: packing_window must be at least seq_len")

    @property
    def window_blocks(self) -> int:
        """Best-fit's window in blocks of the stream."""
        return max(1, self.packing_window // self.block_tokens)


def read_cursor(cursor: object) -> tuple[int, int]:
    """A state's ``packing_cursor`` as (window, its first row), a ValueError naming it unless two whole numbers >= 0."""
    if isinstance(cursor, (list, tuple)) and len(cursor) == 2:
        try:
            window, first = (operator.index(value) for value in cursor)
        except TypeError:
            pass
        else:
            if window >= 0 and first >= 0 and not any(isinstance(value, bool) for value in cursor):
                return window, first
    raise ValueError(f"loader state: packing_cursor={cursor!r} is not a (window, first row) pair of whole numbers")


def rank_share(step_first: int, held: int, batch: int, rank: int, world: int) -> tuple[int, int]:
    """(first row, rows) of ``rank``'s batch in the global step from row ``step_first`` holding ``held``
    rows of the epoch: the r-th ``batch`` of a full step, else the rows split as evenly as they go."""
    if held == batch * world:
        return step_first + rank * batch, batch
    share, extra = divmod(held, world)
    return step_first + rank * share + min(rank, extra), share + int(rank < extra)


def open_corpus(dataset: ShardedDataset, options: TokenOptions) -> TokenCorpus:
    """The documents ``dataset`` holds as one token space: its token shards, or a column of data read in place
    (``options.field``, else ``input_ids``; with ``options.tokenizer``); of a mixture, each member's, one after another."""
    if isinstance(dataset, MixedDataset):
        if any(member.layout.in_place for member in dataset.members):
            refuse_another_tokenizer(dataset, options)
        else:
            refuse_column_options(dataset, options)
        return MixtureCorpus(dataset, [member_corpus(dataset, number, options) for number in range(len(dataset.members))])
    if dataset.layout.in_place:
        return ColumnCorpus(dataset, options.field, options.tokenizer)
    refuse_column_options(dataset, options)
    return ShardCorpus(dataset)


def refuse_column_options(dataset: ShardedDataset, options: TokenOptions) -> None:
    """A ValueError naming ``fields=`` and ``tokenizer=`` where given for ``dataset``, which reads no column in place."""
    given = [name for name, value in (("fields", options.field), ("tokenizer", options.tokenizer)) if value is not None]
    if given:
        held = "token shards, whose documents are their tokens" if dataset.index.tokenizer is not None else "no column read in place"
        raise ValueError(f"{', '.join(name + '=' for name in given)} name the column (and its tokenizer) of data read in place; "
                         f"{dataset.location} holds {held}")


def refuse_another_tokenizer(mixture: MixedDataset, options: TokenOptions) -> None:
    """A ValueError naming the mixture's first member read in place unless ``options.tokenizer``, which its members read
    in place are read with, is its token datasets' tokenizer (if it has any): checked before a column is counted."""
    converted = next(((n, m, tokenizer) for n, m in enumerate(mixture.members) if (tokenizer := m.index.tokenizer) is not None), None)
    if converted is None:
        return
    number, member = next((n, m) for n, m in enumerate(mixture.members) if m.layout.in_place)
    theirs = f"member {converted[0]}'s ({converted[1].location})"
    if options.tokenizer is None:
        raise ValueError(f"mix: member {number} ({member.location}) reads token ids in place with no tokenizer= to check them "
                         f"against {theirs}: name the tokenizer its ids are of with tokenizer=")
    if TextTokenizer(options.tokenizer).identity.sha256 != converted[2].sha256:
        raise ValueError(f"mix: member {number} ({member.location}) is read with a tokenizer= other than {theirs}: "
                         "one id would mean two tokens")


def member_corpus(mixture: MixedDataset, number: int, options: TokenOptions) -> TokenCorpus:
    """Member ``number`` of a mixture by tokens as a token space: its token shards, or its column read in place
    (a ValueError about the column naming the member)."""
    member = mixture.members[number]
    if not member.layout.in_place:
        return ShardCorpus(member)
    try:
        return ColumnCorpus(member, options.field, options.tokenizer)
    except ValueError as error:
        raise ValueError(f"mix: member {number} ({member.location}): {error}") from None


EpochRows = StreamRows | PaddedRows | BestFitRows | MixtureRows
# best-fit: the window holding a row and its first row (and, after a resume at another seq_len, the origin of its rows:
# their boundaries); concat: the origin (StreamRows: row, token); an origin is best-fit's boundaries too (TokenRows.origin)
Cursor = tuple[Any, ...]
BatchWork = tuple[int, int, Cursor | None]  # a rank's batch: its first row of the epoch, its rows (the rest padding), and locate()'s cursor


@dataclass(frozen=True)
class StepRows:
    """A rank's batch at a global step (:meth:`TokenRows.batch_at`): its work, and the batch size and seq_len it ran at."""

    work: BatchWork
    batch_size: int
    seq_len: int


KEPT_EPOCH_ROWS = 2  # epochs' rows kept, by (epoch, origin): an epoch's and the next one's the workers run ahead into


class TokenRows:
    """The rows of every epoch of a token dataset (or a mixture by tokens) for one loader's
    options: each epoch's rows made when first asked for (the latest kept, with best-fit's counts
    of rows). The loader and each of its workers hold their own."""

    def __init__(self, dataset: ShardedDataset, options: TokenOptions, seed: int, shuffle: bool) -> None:
        self.mixture = dataset if isinstance(dataset, MixedDataset) else None
        if self.mixture is not None and options.packing is not Packing.CONCAT:
            raise ValueError("a mixture by tokens is made of concat rows (every row seq_len tokens of one member): packing='concat'")
        self.corpus = open_corpus(dataset, options)
        self.options, self.seed, self.shuffle = options, seed, shuffle
        if isinstance(self.corpus, MixtureCorpus):
            refuse_members_shorter_than_a_row(self.corpus, options.seq_len)
        self._kept: dict[tuple[int, Cursor | None], EpochRows] = {}

    def of(self, epoch: int, origin: Cursor | None = None, seq_len: int | None = None) -> EpochRows:
        """The rows of ``epoch``; ``origin`` (:meth:`origin`; None: the epoch's start) is where they are cut from after a
        resume at another seq_len: for concat, (row, stream token); for best-fit, the resumes' boundaries. ``seq_len``:
        rows as an earlier segment of the epoch cut them (:meth:`cuts`; made anew each time), else this loader's (kept)."""
        concat = self.mixture is None and self.options.packing is Packing.CONCAT
        if seq_len is not None and seq_len != self.options.seq_len:
            return self._cut(epoch, seq_len, origin, concat)
        key = (epoch, (origin or (0, 0)) if concat else tuple(origin or ()) if self.options.packing is Packing.BEST_FIT else None)
        rows = self._kept.get(key)
        if rows is None:
            rows = self._cut(epoch, self.options.seq_len, origin, concat)
            if len(self._kept) >= KEPT_EPOCH_ROWS:
                self._kept.pop(next(iter(self._kept)))
            self._kept[key] = rows
        return rows

    def _cut(self, epoch: int, seq_len: int, origin: Cursor | None, concat: bool) -> EpochRows:
        """``epoch``'s rows of ``seq_len`` tokens cut from ``origin`` (see :meth:`of`)."""
        options, corpus = self.options, self.corpus
        if self.mixture is not None:
            assert isinstance(corpus, MixtureCorpus)  # a mixture's corpus (open_corpus)
            return MixtureRows(self.mixture, corpus, seq_len, options.block_tokens, self.seed, epoch, self.shuffle)
        if concat:
            return StreamRows(corpus, seq_len, options.block_tokens, self.seed, epoch, self.shuffle, origin or (0, 0))
        if options.packing is Packing.PAD:
            return PaddedRows(corpus, seq_len, self.seed, epoch, self.shuffle)
        return self._best_fit(epoch, seq_len, origin)

    def _best_fit(self, epoch: int, seq_len: int, origin: Cursor | None) -> BestFitRows:
        """``epoch``'s best-fit rows cut at ``seq_len`` from ``origin`` (boundaries; None: the epoch's start)."""
        options = self.options
        return BestFitRows(self.corpus, seq_len, options.block_tokens, options.window_blocks, self.seed, epoch, self.shuffle,
                           origin=tuple(origin or ()))

    def cuts(self, resumed_from: Sequence[tuple[int, ...]]) -> list[tuple[int, Cursor | None]]:
        """(seq_len, origin) of the rows before each of an epoch's ``resumed_from`` entries (their 4th
        number: the seq_len they were cut at), and last of this loader's rows from the last one: the origin
        is where rows of that seq_len count from (None where that is the epoch's start: every row before cut as long).
        Concat's is (row, stream token); best-fit's the :class:`Boundary` of each entry where the seq_len changed, its
        window the entry's 5th and 6th numbers (none: past the epoch's windows, the entry's row the end of the rows before)."""
        if self.options.packing is Packing.BEST_FIT:
            return self._best_fit_cuts(resumed_from)
        cuts: list[tuple[int, Cursor | None]] = []
        row, token = 0, 0
        for entry in (*resumed_from, None):
            if entry is not None and len(entry) > 4:
                raise ValueError(f"loader state: resumed_from holds {list(entry)}, but only best-fit's entries name a window "
                                 f"(this loader packs {self.options.packing.value!r})")
            seq_len = entry[3] if entry is not None and len(entry) > 3 else self.options.seq_len
            from_start = token == row * seq_len or self.mixture is not None or self.options.packing is not Packing.CONCAT
            cuts.append((seq_len, None if from_start else (row, token)))
            if entry is not None:
                row, token = entry[2], token + (entry[2] - row) * seq_len
        return cuts

    def _best_fit_cuts(self, resumed_from: Sequence[tuple[int, ...]]) -> list[tuple[int, Cursor | None]]:
        """:meth:`cuts` for best-fit rows: their origins are the boundaries before them."""
        lengths = [entry[3] if len(entry) > 3 else self.options.seq_len for entry in resumed_from] + [self.options.seq_len]
        cuts: list[tuple[int, Cursor | None]] = []
        boundaries: list[Boundary] = []
        for n, entry in enumerate(resumed_from):
            cuts.append((lengths[n], tuple(boundaries) or None))
            if lengths[n + 1] != lengths[n]:
                past_end = len(entry) < 6  # no window: the row ends the rows before (saved at the epoch's end)
                window, first = (self._best_fit(0, lengths[n], None).windows, entry[2]) if past_end else (entry[4], entry[5])
                boundaries.append(Boundary(entry[2], lengths[n], window, first))
            elif len(entry) > 4:
                raise ValueError(f"loader state: resumed_from holds {list(entry)}, which names a window, but the seq_len after it is the same")
        cuts.append((lengths[-1], tuple(boundaries) or None))
        return cuts

    def origin(self, resumed_from: Sequence[tuple[int, ...]]) -> Cursor | None:
        """The origin of this loader's rows in an epoch resumed from ``resumed_from`` (None: the epoch's start; pad and mixtures: None)."""
        return self.cuts(resumed_from)[-1][1]

    def length(self, epoch: int, origin: Cursor | None = None) -> int:
        """Rows in ``epoch`` (for best-fit, every window's rows counted, once per epoch; cut from ``origin``)."""
        rows = self.of(epoch, origin)
        return rows.total() if isinstance(rows, BestFitRows) else len(rows)

    def segments(self, epoch: int, first: int, count: int, cursor: Cursor | None = None, seq_len: int | None = None) -> Segments:
        """Rows ``first`` to ``first + count`` of ``epoch`` (past its end: empty), numbered from 0;
        ``cursor``: best-fit's window holding row ``first`` and that window's first row, when known (:meth:`locate`,
        with the rows' origin); concat's origin. ``seq_len``: rows an earlier segment cut another way (:meth:`of`)."""
        if count <= 0:
            return Segments.join([])
        if self.options.packing is Packing.BEST_FIT:
            rows = self.of(epoch, cursor[2] if cursor is not None and len(cursor) > 2 else None, seq_len)
            assert isinstance(rows, BestFitRows)
            return rows.segments(first, count, None if cursor is None else (cursor[0], cursor[1]))
        rows = self.of(epoch, cursor, seq_len)
        assert not isinstance(rows, BestFitRows)
        return rows.segments(first, count)

    def locate(self, epoch: int, row: int, origin: Cursor | None = None, seq_len: int | None = None) -> Cursor | None:
        """Best-fit: the window holding ``row`` of ``epoch`` and its first row, with the rows' origin if any (None past the
        end); concat: ``origin``; pad: None. ``seq_len``: as :meth:`of`."""
        rows = self.of(epoch, origin, seq_len)
        if isinstance(rows, BestFitRows):
            found = rows.locate(row)
            return found if found is None or not rows.origin else (*found, rows.origin)
        return origin

    def packing_cursor(self, epoch: int, consumed: int, resumed_from: Sequence[tuple[int, ...]]) -> list[int] | None:
        """What a best-fit state at row ``consumed`` of ``epoch`` saves as its ``packing_cursor``: the window holding that
        row and the window's first row (None at the epoch's start or end, and for other packings)."""
        if self.options.packing is not Packing.BEST_FIT or not consumed:
            return None
        found = self.locate(epoch, consumed, self.origin(resumed_from))
        return None if found is None else [found[0], found[1]]

    def resume_rows(self, epoch: int, consumed: int, cursor: object, origin: Cursor | None = None) -> int:
        """Rows of ``epoch`` that a state at row ``consumed`` with best-fit's ``packing_cursor`` may
        lie within (a ValueError naming ``packing_cursor`` where it is malformed, past the epoch, or
        disagrees with ``consumed``): the epoch's rows, or with a cursor those through its window, where
        locating the rows then starts; cut from ``origin`` (best-fit's boundaries checked, each against the rows before it)."""
        rows = self.of(epoch, origin)
        if isinstance(rows, BestFitRows):
            rows.check_origin()
            if rows.origin and rows.origin[-1].row == consumed:  # resumed here at another seq_len: the cursor is the boundary's
                return consumed + (rows.count(rows.start[0]) if rows.start[0] < rows.windows else 0)
        if cursor is None:
            return rows.total() if isinstance(rows, BestFitRows) else len(rows)
        if not isinstance(rows, BestFitRows):
            raise ValueError(f"loader state: packing_cursor={cursor!r}, but only packing='best-fit' has one (this loader packs "
                             f"{self.options.packing.value!r})")
        window, first = read_cursor(cursor)
        if window >= rows.windows:
            raise ValueError(f"loader state: packing_cursor={cursor!r} names window {window}, past epoch {epoch}'s {rows.windows}")
        if not rows.plausible_first(window, first) or not first <= consumed < first + rows.count(window):
            raise ValueError(f"loader state: packing_cursor={cursor!r} disagrees with samples_consumed={consumed}: "
                             f"window {window} cannot start at row {first} and hold row {consumed}")
        rows.seek(window, first)
        return first + rows.count(window)

    def exists(self, epoch: int, row: int, origin: Cursor | None = None) -> bool:
        """Whether ``epoch`` (concat: cut from ``origin``) holds a row ``row``."""
        rows = self.of(epoch, origin)
        return rows.locate(row) is not None if isinstance(rows, BestFitRows) else row < len(rows)

    def rank_rows(self, epoch: int, step_first: int, batch: int, rank: int, world: int, origin: Cursor | None = None,
                  seq_len: int | None = None) -> tuple[int, int]:
        """(first row, rows) of ``rank``'s batch in the global step from row ``step_first``: the r-th
        ``batch`` rows, but in an epoch's last, partial step its rows split as evenly as they go
        (the first ``held % world`` ranks one more), so a rank's batch is all padding only when
        fewer rows than ranks are left; the rest of a batch is padding (rows cut from ``origin`` at ``seq_len``: :meth:`of`)."""
        rows = self.of(epoch, origin, seq_len)
        step = batch * world
        held = rows.held(step_first, step) if isinstance(rows, BestFitRows) else max(0, min(step, len(rows) - step_first))
        return rank_share(step_first, held, batch, rank, world)

    def step_batch(self, epoch: int, step_first: int, batch: int, rank: int, world: int, origin: Cursor | None = None,
                   seq_len: int | None = None) -> BatchWork:
        """``rank``'s batch in ``epoch``'s global step from row ``step_first``: its first row and rows (:meth:`rank_rows`)
        and where they are found (:meth:`locate`), as a worker makes it (rows cut from ``origin`` at ``seq_len``: :meth:`of`)."""
        first, count = self.rank_rows(epoch, step_first, batch, rank, world, origin, seq_len)
        return first, count, self.locate(epoch, first, origin, seq_len)

    def batch_at(self, epoch: int, step: int, resumed_from: Sequence[tuple[int, ...]], batch: int, rank: int,
                 world: int) -> StepRows | None:
        """``rank``'s batch at global ``step`` of ``epoch`` resumed from ``resumed_from`` and now at (``world``, ``batch``):
        :meth:`step_batch` at the topology, seq_len and origin the step ran at (fastload.orders.steps.step_at; None where
        the rank was not one of that segment's)."""
        found = step_at(epoch, step, resumed_from, world, batch, rank)
        if not found.rank_existed:
            return None
        seq_len, origin = self.cuts(resumed_from)[found.segment]
        work = self.step_batch(epoch, found.consumed, found.batch_size, rank, found.world_size, origin, seq_len)
        return StepRows(work, found.batch_size, seq_len)

    def rank_batches(self, epoch: int, consumed: int, batch: int, rank: int, world: int, drop_last: bool,
                     origin: Cursor | None = None) -> Iterator[BatchWork]:
        """``rank``'s batches of ``epoch`` from row ``consumed`` on (:meth:`step_batch`), a global step of ``batch * world``
        rows each, while the epoch holds the step (:meth:`holds_step`)."""
        step = batch * world
        while self.holds_step(epoch, consumed, step, drop_last, origin):
            yield self.step_batch(epoch, consumed, batch, rank, world, origin)
            consumed += step

    def batch_shards(self, rows: StreamRows | PaddedRows | MixtureRows, consumed: int, batch: int, rank: int, world: int, drop_last: bool) -> Iterator[np.ndarray]:
        """The shards each of ``rank``'s batches opens, batch by batch from row ``consumed`` of ``rows``
        (an epoch's rows of this loader, but best-fit's: those open window by window,
        ``BestFitRows.window_shards``), from the index alone: pure arithmetic, so another thread may
        ask while the loader iterates."""
        step = batch * world
        step_first = consumed
        while step_first + (step - 1 if drop_last else 0) < len(rows):
            first, count = rank_share(step_first, min(step, len(rows) - step_first), batch, rank, world)
            yield rows.shards(first, count)
            step_first += step

    def holds_step(self, epoch: int, first: int, rows: int, drop_last: bool, origin: Cursor | None = None) -> bool:
        """Whether ``epoch`` holds the global step of ``rows`` rows from row ``first``: its first
        row (with ``drop_last``, its last: a step past the epoch's end is padding, or dropped; concat: rows cut from ``origin``)."""
        return self.exists(epoch, first + (rows - 1 if drop_last else 0), origin)

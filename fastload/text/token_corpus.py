"""A dataset's documents as one global token space, read span by span: the spans a batch holds
(:class:`Segments`, as NumPy arrays), what every kind of corpus is (:class:`TokenCorpus`) and token
shards' (:class:`ShardCorpus`: one ``preadv`` a span, every id checked against the tokenizer's
vocabulary) and a mixture by tokens' (:class:`MixtureCorpus`: its members' corpora one after another);
a column of data read in place is fastload.text.column_corpus'. Which spans the rows of an epoch hold
is fastload.text.token_rows' concern."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.errors import ShardError
from fastload.formats.index import TokenizerIdentity
from fastload.formats.tokens.reader import TokenShardReader
from fastload.storage.dataset import ShardedDataset
from fastload.storage.mixed_dataset import MixedDataset


@dataclass(frozen=True)
class Segments:
    """A batch's token spans, row by row (``row`` ascending; a row's segments back to back from column 0)."""

    start: np.ndarray  # int64: each segment's first token in the dataset's global token space
    length: np.ndarray  # int64
    continues: np.ndarray  # bool: its document has a next token after it
    row: np.ndarray  # int64: the batch row holding it

    @staticmethod
    def join(parts: list[Segments]) -> Segments:
        """The segments of ``parts`` one after another (their rows already numbered in the batch)."""
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return Segments(empty, empty, np.zeros(0, dtype=bool), empty)
        return Segments(*(np.concatenate([getattr(p, name) for p in parts]) for name in ("start", "length", "continues", "row")))

    def shifted(self, tokens: int, rows: int) -> Segments:
        """These segments ``tokens`` further in the global token space and ``rows`` further down the batch."""
        return Segments(self.start + tokens, self.length, self.continues, self.row + rows)


class TokenCorpus:
    """A dataset's documents as one global token space (its shards, or parts, one after another), read
    span by span: what token rows are cut from. The arithmetic over ``token_starts`` and ``doc_starts``
    is shared; a kind of corpus gives the rest: token shards (:class:`ShardCorpus`) or a column of data
    read in place (fastload.text.column_corpus)."""

    dataset: ShardedDataset
    tokenizer: TokenizerIdentity | None  # the tokenizer its ids are of (None: a column of ids read in place, no tokenizer named)
    dtype: np.dtype  # what its ids are read into (a batch's staging buffer)
    pad_id: int  # what pads a row: the tokenizer's pad id, else its eos id, else 0
    token_starts: np.ndarray  # int64: each shard's first global token, then the total
    doc_starts: np.ndarray  # int64: each shard's first document, then the total

    @property
    def total(self) -> int:
        """Tokens in the dataset."""
        return int(self.token_starts[-1])

    @property
    def documents(self) -> int:
        """Documents in the dataset."""
        return int(self.doc_starts[-1])

    def shard_of(self, token: int) -> int:
        """The shard holding global token ``token``."""
        return int(np.searchsorted(self.token_starts, token, side="right") - 1)

    def shards_spanned(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The shards holding global tokens ``starts[i]`` through ``ends[i]`` (that one included, as
        whether a document starts there is read; within the dataset), span by span in order: what
        reading those spans opens, found from the index alone."""
        first = np.searchsorted(self.token_starts, starts, side="right") - 1
        last = np.searchsorted(self.token_starts, np.minimum(ends, self.total - 1), side="right") - 1
        return np.concatenate([np.arange(lo, hi + 1) for lo, hi in zip(first.tolist(), last.tolist())] + [np.zeros(0, dtype=np.int64)])

    def starts_inside(self, start: int, end: int) -> np.ndarray:
        """Global positions of the documents starting strictly between ``start`` and ``end``."""
        raise NotImplementedError

    def starts_document(self, token: int) -> bool:
        """Whether a document starts at global token ``token`` (the end of the tokens: no next token, so True)."""
        raise NotImplementedError

    def documents_at(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first global token, tokens) of documents ``indices`` (numbered across the shards)."""
        raise NotImplementedError

    def read_into(self, buffer: np.ndarray, segments: Segments, destinations: np.ndarray, extra: np.ndarray) -> np.ndarray:
        """Each segment's tokens into ``buffer`` (of :attr:`dtype`) at its destination (with the document's
        next token, where ``extra`` says it continues, which is also returned: the next segment may overwrite it)."""
        raise NotImplementedError

    def named(self, token: int) -> dict[str, Any]:
        """How ``describe`` names the document holding global token ``token``: its shard, its document
        there, and ``offset``, the token's place in the document."""
        raise NotImplementedError

    def identity(self) -> str:
        """What names the tokens read, for a loader's identity digest."""
        raise NotImplementedError


class ShardCorpus(TokenCorpus):
    """A token dataset's global token space: its token shards concatenated, read span by span (one
    ``preadv`` a span, every id checked against the tokenizer's vocabulary)."""

    def __init__(self, dataset: ShardedDataset) -> None:
        if dataset.index.tokenizer is None:
            raise ValueError(f"{dataset.location} holds no tokens (convert documents with --tokenizer)")
        self.dataset = dataset
        self.tokenizer: TokenizerIdentity = dataset.index.tokenizer
        self.dtype = np.dtype(self.tokenizer.dtype)
        self.pad_id = next(i for i in (self.tokenizer.pad_id, self.tokenizer.eos_id, 0) if i is not None)
        self.token_starts = np.array(list(itertools.accumulate((s.tokens or 0 for s in dataset.index.shards), initial=0)), dtype=np.int64)
        self.doc_starts = np.array(list(itertools.accumulate((s.samples for s in dataset.index.shards), initial=0)), dtype=np.int64)

    def reader(self, shard: int) -> TokenShardReader:
        """Shard ``shard``'s reader, open in this process."""
        reader = self.dataset.reader(shard)
        assert isinstance(reader, TokenShardReader)  # a token dataset's layout opens token readers
        return reader

    def starts_inside(self, start: int, end: int) -> np.ndarray:
        """Global positions of the documents starting strictly between ``start`` and ``end``."""
        found = []
        first, last = self.shard_of(start), self.shard_of(max(end - 1, start))
        for shard in range(first, last + 1):
            base = int(self.token_starts[shard])
            reader = self.reader(shard)
            offsets = reader.offsets()
            lo = int(np.searchsorted(offsets, max(start - base, 0), side="right"))
            hi = int(np.searchsorted(offsets, end - base, side="left"))
            if hi > lo:
                part = reader.checked_offsets(lo, hi - 1) + base
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

    def documents_at(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(first global token, tokens) of documents ``indices`` (numbered across the shards)."""
        shards = np.searchsorted(self.doc_starts, indices, side="right") - 1
        starts, lengths = np.empty(len(indices), dtype=np.int64), np.empty(len(indices), dtype=np.int64)
        for shard in np.unique(shards).tolist():
            at = shards == shard
            reader = self.reader(shard)
            local = indices[at] - self.doc_starts[shard]
            offsets = reader.offsets()
            first, end = offsets[local].astype(np.int64), offsets[local + 1].astype(np.int64)
            if np.any(end < first) or np.any(end > reader.tokens):
                raise ShardError(f"{reader.data}: its document table's offsets do not ascend within its {reader.tokens} tokens (tampered?)")
            starts[at], lengths[at] = first + self.token_starts[shard], end - first
        return starts, lengths

    def read_into(self, buffer: np.ndarray, segments: Segments, destinations: np.ndarray, extra: np.ndarray) -> np.ndarray:
        """Each segment's tokens into ``buffer`` (of the dataset's dtype) at its destination, one
        ``preadv`` a segment (with the document's next token, where it continues, which is also
        returned: the next segment may overwrite it); every id is checked against the vocabulary."""
        shards = np.searchsorted(self.token_starts, segments.start, side="right") - 1
        local = segments.start - self.token_starts[shards]
        counts = segments.length + extra
        sizes = np.diff(self.token_starts)[shards]  # each segment's shard's tokens
        if np.any(local < 0) or np.any(local + counts > sizes):
            raise ShardError(f"{self.dataset.location}: a span read lies outside its shard (a tampered document table?)")
        itemsize = self.dtype.itemsize
        raw = buffer.data.cast("B")
        nexts = np.zeros(len(counts), dtype=np.int64)
        descriptors = {shard: self.reader(shard).descriptor() for shard in set(shards.tolist())}
        for i, (shard, first, count, dest, more) in enumerate(zip(shards.tolist(), (local * itemsize).tolist(), (counts * itemsize).tolist(),
                                                                   (destinations * itemsize).tolist(), extra.tolist())):
            if os.preadv(descriptors[shard], [raw[dest : dest + count]], first) != count:
                raise ShardError(f"{self.reader(shard).data}: cut short (truncated since it was opened?)")
            if more:
                nexts[i] = buffer[(dest + count) // itemsize - 1]
        if self.tokenizer.vocab_size < 2 ** (8 * itemsize):
            self._check_ids(buffer, segments, destinations, nexts, shards)
        return nexts

    def _check_ids(self, buffer: np.ndarray, segments: Segments, destinations: np.ndarray, nexts: np.ndarray, shards: np.ndarray) -> None:
        """Refuse ids at or beyond the vocabulary, naming the shard and the tokens holding one."""
        vocab = self.tokenizer.vocab_size
        end = int((destinations + segments.length).max(initial=0))
        if int(buffer[:end].max(initial=0)) < vocab and int(nexts.max(initial=0)) < vocab:
            return
        for i in range(len(shards)):
            dest, n = int(destinations[i]), int(segments.length[i])
            worst = max(int(buffer[dest : dest + n].max(initial=0)), int(nexts[i]))
            if worst >= vocab:
                reader = self.reader(int(shards[i]))
                first = int(segments.start[i] - self.token_starts[shards[i]])
                raise ShardError(f"{reader.data}: token id {worst} at or beyond the tokenizer's vocabulary of {vocab} "
                                 f"(tokens {first}..{first + n + 1})")

    def named(self, token: int) -> dict[str, Any]:
        """The shard's name, the document's number in it and the token's offset in the document."""
        shard = self.shard_of(token)
        local = token - int(self.token_starts[shard])
        reader = self.reader(shard)
        document = int(np.searchsorted(reader.offsets(), local, side="right") - 1)
        return {"shard": self.dataset.shard_name(shard), "document": document, "offset": local - reader.bounds(document)[0]}

    def identity(self) -> str:
        """Each shard's path, tokens and checksum."""
        return "".join(f"{shard.path}|{shard.tokens}|{shard.sha256};" for shard in self.dataset.index.shards)


class MixtureCorpus(TokenCorpus):
    """A mixture by tokens' members as one global token space: each member's corpus (its token shards, or a column
    read in place) after the one before. Its rows are cut from the members' corpora
    (fastload.text.epoch_rows.MixtureRows); a batch's spans are read from the member holding each, and named by it.
    Its members share a tokenizer (fastload.mix checks the token datasets', fastload.text.token_rows the ``tokenizer=``
    its members read in place are read with), so the first token dataset's (else the first member's) pads its rows."""

    def __init__(self, mixture: MixedDataset, members: list[TokenCorpus]) -> None:
        self.dataset, self.members = mixture, members
        reference = next((corpus for corpus in members if not corpus.dataset.layout.in_place), members[0])  # the mixture's tokenizer's
        # token shards only: read as one dataset's (one ``preadv`` a segment, the ids checked once)
        self.shards = ShardCorpus(mixture) if all(isinstance(corpus, ShardCorpus) for corpus in members) else None
        self.tokenizer, self.pad_id = reference.tokenizer, reference.pad_id
        self.dtype = np.result_type(*(corpus.dtype for corpus in members))
        self.bases = np.array(list(itertools.accumulate((corpus.total for corpus in members), initial=0)), dtype=np.int64)
        self.token_starts = np.concatenate([c.token_starts[:-1] + base for c, base in zip(members, self.bases)] + [self.bases[-1:]])
        firsts = np.array(list(itertools.accumulate((corpus.documents for corpus in members), initial=0)), dtype=np.int64)
        self.doc_starts = np.concatenate([c.doc_starts[:-1] + first for c, first in zip(members, firsts)] + [firsts[-1:]])

    def read_into(self, buffer: np.ndarray, segments: Segments, destinations: np.ndarray, extra: np.ndarray) -> np.ndarray:
        """Each segment's tokens into ``buffer`` at its destination, read by its member's corpus (with the document's next
        token where ``extra`` says so, returned): into ``buffer`` itself, or where the member's ids are of another dtype
        (a column read in place beside token shards), into a buffer of its own dtype and copied over; token shards
        only, as one dataset's."""
        if self.shards is not None:
            return self.shards.read_into(buffer, segments, destinations, extra)
        nexts = np.zeros(len(segments.start), dtype=np.int64)
        owners = np.searchsorted(self.bases, segments.start, side="right") - 1
        firsts = np.empty(len(owners), dtype=buffer.dtype)
        for member in np.unique(owners).tolist():
            at, corpus = np.flatnonzero(owners == member), self.members[member]
            mine = Segments(segments.start[at] - self.bases[member], segments.length[at], segments.continues[at], segments.row[at])
            own = buffer if corpus.dtype == buffer.dtype else np.zeros(len(buffer), dtype=corpus.dtype)  # zeros: what it checks is ids
            nexts[at] = corpus.read_into(own, mine, destinations[at], extra[at])
            if own is not buffer:
                lengths = mine.length
                held = np.repeat(destinations[at], lengths) + np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
                buffer[held] = own[held]
            firsts[at] = buffer[destinations[at]]
        buffer[destinations] = firsts  # a next token read past a segment lands on the next one's first: maybe another member's, read before
        return nexts

    def named(self, token: int) -> dict[str, Any]:
        """As its member names the token's document, the shard (file) prefixed by the member's location."""
        member = int(np.searchsorted(self.bases, token, side="right") - 1)
        named = self.members[member].named(token - int(self.bases[member]))
        return {**named, "shard": f"{self.members[member].dataset.location}/{named['shard']}"}

    def identity(self) -> str:
        """The members' identities, one after another."""
        return "".join(corpus.identity() for corpus in self.members)

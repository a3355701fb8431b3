"""A batch of token rows as a language model's training loop takes it: ``input_ids``, ``labels``
(the next token; the ignore index across document boundaries and on padding), ``position_ids``
restarting at each segment, ``attention_mask`` (0 on padding), and the boundaries for
variable-length attention as flash-attention takes them: ``cu_seqlens`` (int32, over the batch
flattened to ``B * L`` tokens; a row's padding is a segment of its own) and ``max_seqlen``.

Made with a few whole-batch NumPy operations, whatever the number of segments: each segment's ids
are read by one ``preadv`` straight into a staging buffer laid out as the batch, which is then
widened into ``input_ids`` and, shifted by one token, into ``labels``; only the segments' ends
(their next token or the ignore index) and the padding are written one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastload.loading.token_rows import IGNORE_INDEX, Segments, TokenCorpus

TOKEN_COLUMNS = ("input_ids", "labels", "position_ids", "attention_mask")  # the (B, L) int64 arrays of a batch


@dataclass(frozen=True)
class BatchBounds:
    """What a filled batch adds to its four arrays: the boundaries and what it holds (plain values:
    a worker's answer carries it through a pipe, where pickling an array costs 3x a bytearray)."""

    cu_seqlens: bytearray  # int32 (segments + 1,), native order
    max_seqlen: int
    tokens: int  # real tokens (not padding)
    rows: int  # rows holding tokens


class BatchFiller:
    """Fills batches of ``seq_len``-long rows from a corpus into given arrays; keeps its staging buffer between batches."""

    def __init__(self, corpus: TokenCorpus, seq_len: int, pad_id: int, ignore_index: int = IGNORE_INDEX) -> None:
        self.corpus, self.seq_len, self.pad_id, self.ignore_index = corpus, seq_len, pad_id, ignore_index
        self._staging = np.zeros(0, dtype=corpus.dtype)
        self._positions = np.zeros(0, dtype=np.int64)

    def _buffers(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The staging buffer (one token longer than the batch) and ``arange(size)``, grown as needed."""
        if len(self._staging) < size + 1:
            self._staging = np.zeros(size + 1, dtype=self.corpus.dtype)
            self._positions = np.arange(size, dtype=np.int64)
        return self._staging, self._positions[:size]

    def fill(self, segments: Segments, out: dict[str, np.ndarray]) -> BatchBounds:
        """Write the batch of ``segments`` into ``out``'s (B, L) int64 arrays (named as
        :data:`TOKEN_COLUMNS`); rows without segments are padding."""
        rows, seq_len = out["input_ids"].shape
        size = rows * seq_len
        staging, arange = self._buffers(size)
        lengths, row = segments.length, segments.row
        ends_in_batch = np.cumsum(lengths)
        first_of_row = np.searchsorted(row, row, side="left")  # each segment's row's first segment
        columns = ends_in_batch - lengths - (ends_in_batch - lengths)[first_of_row]
        destinations = row * seq_len + columns
        nexts = self.corpus.read_into(staging, segments, destinations, segments.continues.astype(np.int64))
        used = np.bincount(row, weights=lengths, minlength=rows).astype(np.int64)
        padded = np.flatnonzero(used < seq_len)
        flat = {name: out[name].reshape(-1) for name in TOKEN_COLUMNS}
        np.copyto(flat["input_ids"], staging[:size])
        np.copyto(flat["labels"][:-1], staging[1:size])
        ends = destinations + lengths - 1
        flat["labels"][ends] = np.where(segments.continues, nexts, self.ignore_index)
        # every segment, the rows' padding included, by its first position: positions restart at each
        starts, spans = destinations, lengths
        if len(padded):
            starts = np.concatenate([destinations, padded * seq_len + used[padded]])
            spans = np.concatenate([lengths, seq_len - used[padded]])
            order = np.argsort(starts, kind="stable")
            starts, spans = starts[order], spans[order]
        np.subtract(arange, np.repeat(starts, spans), out=flat["position_ids"])
        flat["attention_mask"].fill(1)
        for r, first in zip(padded.tolist(), used[padded].tolist()):  # at most a slice an array a row
            out["input_ids"][r, first:] = self.pad_id
            out["labels"][r, first:] = self.ignore_index
            out["attention_mask"][r, first:] = 0
        bounds = np.empty(len(starts) + 1, dtype=np.int32)
        bounds[:-1], bounds[-1] = starts, size
        return BatchBounds(bytearray(bounds.tobytes()), int(spans.max(initial=0)), int(lengths.sum()), int(np.count_nonzero(used)))

    def batch(self, segments: Segments, rows: int) -> tuple[dict[str, np.ndarray], BatchBounds]:
        """A fresh batch of ``rows`` rows (its arrays this batch's own)."""
        out = {name: np.empty((rows, self.seq_len), dtype=np.int64) for name in TOKEN_COLUMNS}
        return out, self.fill(segments, out)

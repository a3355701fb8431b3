"""A batch of token rows as a language model's training loop takes it, in one of two formats:

- ``next-token`` (the default; torchtitan-style loops, Megatron, flash-attention's varlen
  functions): ``input_ids``, ``labels`` (the next token of the same document; the ignore index
  at a document's end and on padding), ``position_ids`` restarting at each segment,
  ``attention_mask`` (0 on padding), ``cu_seqlens`` (int32, over the batch flattened to ``B * L``
  tokens; a row's padding is a segment of its own) and ``max_seqlen``;
- ``transformers`` (a Hugging Face model called with the batch as keyword arguments, as ``Trainer``
  does): ``input_ids``, ``labels`` lined up with them (the model shifts them itself), the ignore
  index at each segment's first token and on padding, and ``position_ids``; no attention mask,
  which a model's own packed-sequence detection does not reliably replace (see :class:`Attention`).

``attention=`` adds what a model's attention implementation needs to keep a row's documents apart
(fastload.text.token_attention makes it, in the training process on the batch's device):
``block-causal`` (eager and SDPA) a (B, 1, L, L) ``attention_mask``; ``varlen`` (flash-attention)
the boundaries under the names transformers' ``FlashAttentionKwargs`` take.

Made with a few whole-batch NumPy operations, whatever the number of segments: each segment's ids
are read by one ``preadv`` straight into a staging buffer laid out as the batch, which is then
widened into ``input_ids`` and ``labels`` (shifted by one token for ``next-token``); only the
segments' edges and the padding are written one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from fastload.text.token_corpus import Segments, TokenCorpus
from fastload.text.token_rows import IGNORE_INDEX


class BatchFormat(Enum):
    """Which arrays a batch holds and how its labels line up (see the module docstring)."""

    NEXT_TOKEN = "next-token"
    TRANSFORMERS = "transformers"

    @property
    def columns(self) -> tuple[str, ...]:
        """The (B, L) int64 arrays of a batch of this format."""
        if self is BatchFormat.TRANSFORMERS:
            return ("input_ids", "labels", "position_ids")
        return ("input_ids", "labels", "position_ids", "attention_mask")


class Attention(Enum):
    """What a batch adds so that a model's attention keeps the documents of a row apart.

    ``BLOCK_CAUSAL``: ``attention_mask`` is a (B, 1, L, L) float32 additive mask, 0 where a token
    may attend (an earlier or the same token of its own segment) and float32's lowest value
    elsewhere: the 4-D mask transformers' eager and SDPA attention take as it is.
    ``VARLEN``: ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (int32, the segments' boundaries over the
    batch flattened to B * L tokens) and ``max_length_q`` / ``max_length_k`` (ints), and no
    ``attention_mask`` (given one, transformers' flash-attention unpads by it instead).
    """

    BLOCK_CAUSAL = "block-causal"
    VARLEN = "varlen"


@dataclass(frozen=True)
class BatchBounds:
    """What a filled batch adds to its arrays: the boundaries and what it holds (plain values: a
    worker's answer carries it through a pipe, where pickling an array costs 3x a bytearray)."""

    cu_seqlens: bytearray  # int32 (segments + 1,), native order
    max_seqlen: int
    tokens: int  # real tokens (not padding)
    rows: int  # rows holding tokens


class BatchFiller:
    """Fills batches of ``seq_len``-long rows from a corpus into given arrays; keeps its staging buffer between batches."""

    def __init__(self, corpus: TokenCorpus, seq_len: int, pad_id: int, ignore_index: int = IGNORE_INDEX,
                 batch_format: BatchFormat = BatchFormat.NEXT_TOKEN, attention: Attention | None = None) -> None:
        self.corpus, self.seq_len, self.pad_id, self.ignore_index = corpus, seq_len, pad_id, ignore_index
        self.format, self.attention = batch_format, attention
        self._staging = np.zeros(0, dtype=corpus.dtype)
        self._positions = np.zeros(0, dtype=np.int64)

    def _buffers(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The staging buffer (one token longer than the batch) and ``arange(size)``, grown as needed."""
        if len(self._staging) < size + 1:
            self._staging = np.zeros(size + 1, dtype=self.corpus.dtype)
            self._positions = np.arange(size, dtype=np.int64)
        return self._staging, self._positions[:size]

    def fill(self, segments: Segments, out: dict[str, np.ndarray]) -> BatchBounds:
        """Write the batch of ``segments`` into ``out``'s (B, L) int64 arrays (this format's
        :attr:`BatchFormat.columns`); rows without segments are padding."""
        rows, seq_len = out["input_ids"].shape
        size = rows * seq_len
        staging, arange = self._buffers(size)
        lengths, row = segments.length, segments.row
        ends_in_batch = np.cumsum(lengths)
        first_of_row = np.searchsorted(row, row, side="left")  # each segment's row's first segment
        columns = ends_in_batch - lengths - (ends_in_batch - lengths)[first_of_row]
        destinations = row * seq_len + columns
        next_token = self.format is BatchFormat.NEXT_TOKEN
        wanted = segments.continues.astype(np.int64) if next_token else np.zeros(len(lengths), dtype=np.int64)
        nexts = self.corpus.read_into(staging, segments, destinations, wanted)
        used = np.bincount(row, weights=lengths, minlength=rows).astype(np.int64)
        padded = np.flatnonzero(used < seq_len)
        flat = {name: out[name].reshape(-1) for name in self.format.columns}
        np.copyto(flat["input_ids"], staging[:size])
        if next_token:
            np.copyto(flat["labels"][:-1], staging[1:size])
            flat["labels"][destinations + lengths - 1] = np.where(segments.continues, nexts, self.ignore_index)
        else:
            np.copyto(flat["labels"], staging[:size])
            flat["labels"][destinations] = self.ignore_index  # nothing in the row before a segment predicts its first token
        # every segment, the rows' padding included, by its first position: positions restart at each
        starts, spans = destinations, lengths
        if len(padded):
            starts = np.concatenate([destinations, padded * seq_len + used[padded]])
            spans = np.concatenate([lengths, seq_len - used[padded]])
            order = np.argsort(starts, kind="stable")
            starts, spans = starts[order], spans[order]
        np.subtract(arange, np.repeat(starts, spans), out=flat["position_ids"])
        if next_token:
            flat["attention_mask"].fill(1)
        for r, first in zip(padded.tolist(), used[padded].tolist()):  # at most a slice an array a row
            out["input_ids"][r, first:] = self.pad_id
            out["labels"][r, first:] = self.ignore_index
            if next_token:
                out["attention_mask"][r, first:] = 0
        bounds = np.empty(len(starts) + 1, dtype=np.int32)
        bounds[:-1], bounds[-1] = starts, size
        return BatchBounds(bytearray(bounds.tobytes()), int(spans.max(initial=0)), int(lengths.sum()), int(np.count_nonzero(used)))

    def batch(self, segments: Segments, rows: int) -> tuple[dict[str, np.ndarray], BatchBounds]:
        """A fresh batch of ``rows`` rows (its arrays this batch's own)."""
        out = {name: np.empty((rows, self.seq_len), dtype=np.int64) for name in self.format.columns}
        return out, self.fill(segments, out)

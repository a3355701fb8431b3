"""The token orders, as pure functions of (seed, epoch, position): which token spans a row holds.

An epoch's *stream* is the dataset's tokens (shards concatenated: the global token space) cut
into blocks of ``block`` tokens, the full blocks in a seeded permutation (the shorter last one
last), and inside each block the documents that lie wholly in it in a seeded order of their own
(the pieces of the documents cut by the block's edges stay at its ends). So any stream position
maps to a token with arithmetic and one block's document starts: nothing per document or per
block is held, and the shuffle is that of documents within a block and of blocks in the epoch.
A *piece* is a run of one document's tokens that is contiguous in the stream; labels never cross
from one piece to the next.

Which member of a mixture by tokens each row comes from is the mixtures' arithmetic
(:func:`fastload.orders.mixing.mixture_members`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastload.orders.permutation import Permutation, mix_key

BLOCK_KEY = 0x70C3B  # tags the block order's key
PIECE_KEY = 0x70C3D  # tags a block's document order's key
ROW_KEY = 0x70C3F  # tags the order of the rows packed from a block (best-fit) and of documents (pad)


@dataclass(frozen=True)
class TokenStream:
    """One epoch's stream over ``total`` tokens in blocks of ``block`` tokens."""

    total: int
    block: int
    seed: int
    epoch: int
    shuffle: bool

    @property
    def full_blocks(self) -> int:
        """Blocks of exactly ``block`` tokens (a shorter one follows when ``total`` is not a multiple)."""
        return self.total // self.block

    @property
    def blocks(self) -> int:
        """Blocks in the stream, the shorter last one included."""
        return -(-self.total // self.block)

    def block_span(self, order_index: int) -> tuple[int, int, int]:
        """(block number, first global token, tokens) of the block at ``order_index`` of the stream."""
        if not 0 <= order_index < self.blocks:
            raise IndexError(f"block {order_index} of {self.blocks}")
        starts, sizes = self.block_spans(order_index, order_index + 1)
        return int(starts[0]) // self.block, int(starts[0]), int(sizes[0])

    def block_spans(self, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """(first global token, tokens) of the blocks at ``first`` to ``end`` of the stream: the full
        blocks in the epoch's permutation, the shorter last one last."""
        indices = np.arange(first, end, dtype=np.int64)
        numbers, full = indices.copy(), indices < self.full_blocks
        numbers[full] = Permutation(self.full_blocks, mix_key(self.seed, self.epoch, BLOCK_KEY), self.shuffle)(indices[full])
        return numbers * self.block, np.where(full, self.block, self.total - numbers * self.block)

    def piece_order(self, number: int, inner: int) -> np.ndarray:
        """The order of block ``number``'s ``inner`` whole documents in the stream."""
        return Permutation(inner, mix_key(self.seed, self.epoch, PIECE_KEY, number), self.shuffle)(np.arange(inner))


def block_pieces(stream: TokenStream, number: int, start: int, length: int, doc_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pieces of the block ``number`` (global tokens ``start`` to ``start + length``) in stream
    order, as (first global token, tokens) arrays, given the global positions of the documents
    starting strictly inside it (ascending): the piece before the first start, the whole
    documents in the block's own order, the piece after the last start."""
    end = start + length
    cuts = np.concatenate([[start], doc_starts, [end]]).astype(np.int64)
    starts, lengths = cuts[:-1], np.diff(cuts)
    if len(starts) <= 2:
        keep = lengths > 0
        return starts[keep], lengths[keep]
    inner = np.arange(1, len(starts) - 1)
    order = np.concatenate([[0], inner[stream.piece_order(number, len(inner))], [len(starts) - 1]])
    starts, lengths = starts[order], lengths[order]
    keep = lengths > 0
    return starts[keep], lengths[keep]

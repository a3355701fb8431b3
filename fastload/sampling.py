"""Sample order as pure functions of (dataset size, seed, epoch, rank, world size, position).

The epoch's order is one global permutation. Training consumes it in *global steps* of
``world_size * batch_size`` samples; in each step rank r takes the r-th slice of ``batch_size``.
So after k steps exactly the first ``k * world_size * batch_size`` samples of the order have been
seen, whatever the world size, and a resume (at any world size) continues from that position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The epoch's global order: ``arange`` or a permutation seeded by (seed, epoch)."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.Generator(np.random.PCG64([seed, epoch, 0x5EED])).permutation(num_samples).astype(np.int64)


def shard_buffer_order(shard_sizes: list[int], seed: int, epoch: int, buffer_size: int) -> np.ndarray:
    """The streaming order: shards in a seeded random order, each read once from start to end,
    its samples passed through a shuffle buffer of ``buffer_size``.

    The trade-off against :func:`epoch_order`'s global permutation: every shard is read once,
    sequentially (what object storage needs), but samples close together in the order come from
    the few shards the buffer spans (about ``buffer_size / shard size`` of them), so batches are
    less independent; a buffer of several shards' worth keeps that small. Like the permutation,
    it is a pure function of (shard sizes, seed, epoch), so resume stays exact.
    """
    if buffer_size < 1:
        raise ValueError("buffer_size must be >= 1")
    rng = np.random.Generator(np.random.PCG64([seed, epoch, 0xB0FF]))
    starts = np.concatenate([[0], np.cumsum(shard_sizes)]).astype(np.int64)
    stream = np.concatenate(
        [np.arange(starts[s], starts[s + 1], dtype=np.int64) for s in rng.permutation(len(shard_sizes))]
        or [np.zeros(0, np.int64)]
    )
    out = np.empty_like(stream)
    buffer = stream[:buffer_size].copy()
    picks = rng.integers(0, len(buffer), size=max(len(stream) - len(buffer), 0)) if len(buffer) else []
    for n, (incoming, pick) in enumerate(zip(stream[len(buffer):], picks)):
        out[n] = buffer[pick]
        buffer[pick] = incoming
    rng.shuffle(buffer)
    out[len(stream) - len(buffer):] = buffer
    return out


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The random stream of one sample's augmentation: depends only on (seed, epoch, index)."""
    return np.random.Generator(np.random.Philox(key=[seed & (2**64 - 1), ((epoch & 0xFFFFFFFF) << 32) | (index & 0xFFFFFFFF)]))


@dataclass(frozen=True)
class RankBatches:
    """The batches of one rank for the rest of an epoch: positions into the epoch's order."""

    batches: tuple[np.ndarray, ...]
    start: int  # global position this plan starts at (samples already consumed)
    step: int  # global samples consumed per batch (world_size * batch_size)
    end: int  # global position after the last batch
    last_valid: np.ndarray | None = None  # False where the last batch repeats a sample as padding

    def valid(self, batch_no: int) -> np.ndarray:
        """Which entries of batch ``batch_no`` are real samples rather than padding."""
        if batch_no == len(self.batches) - 1 and self.last_valid is not None:
            return self.last_valid
        return np.ones(len(self.batches[batch_no]), dtype=bool)

    def consumed_after(self, batches_done: int) -> int:
        """Global samples consumed once ``batches_done`` of these batches were handed out."""
        if batches_done >= len(self.batches):
            return self.end
        return self.start + batches_done * self.step


def rank_batches(
    num_samples: int, start: int, batch_size: int, rank: int, world_size: int, drop_last: bool
) -> RankBatches:
    """Split order positions ``[start, num_samples)`` into this rank's batches.

    Every rank gets the same number of batches (so collective operations never wait for a rank
    that has finished). The tail that does not fill a global step is dropped with ``drop_last``;
    otherwise one more, smaller batch per rank covers it, padded with samples from the start of
    the order when the ranks' shares would be unequal; ``RankBatches.valid`` marks the padding.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    if not 0 <= start <= num_samples:
        raise ValueError(f"resume position {start} is outside the epoch's {num_samples} samples")
    step = batch_size * world_size
    full_steps = (num_samples - start) // step
    batches = [
        np.arange(start + k * step + rank * batch_size, start + k * step + (rank + 1) * batch_size, dtype=np.int64)
        for k in range(full_steps)
    ]
    tail_start = start + full_steps * step
    tail = num_samples - tail_start
    end = tail_start
    last_valid = None
    if tail and not drop_last:
        share = -(-tail // world_size)  # ceil: every rank gets the same count
        positions = np.arange(tail_start + rank * share, tail_start + (rank + 1) * share, dtype=np.int64)
        last_valid = positions < num_samples
        batches.append(np.where(last_valid, positions, positions - tail_start) % num_samples)
        end = num_samples
    return RankBatches(batches=tuple(batches), start=start, step=step, end=end, last_valid=last_valid)

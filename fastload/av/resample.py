"""A crop resampled by torchaudio's default recipe (``torchaudio.functional.resample``: a windowed
sinc, Hann window, 6 zero crossings, cut-off at 0.99 of the lower Nyquist rate), as matrix products
per crop: the input in blocks of ``orig`` samples (the rates divided by their greatest common
divisor, times a few where that is short) times the kernel's ``new`` filters, made once per pair of
rates (in pieces small enough for one thread: SINGLE_THREAD_PRODUCT), each group of filters only
over the inputs it reaches (banded_kernel).

Measured on 2 s crops to 16 kHz: FFmpeg's swr through PyAV sets up a filter graph per crop (1-2 ms,
as much as decoding the crop); the whole kernel as one product took 0.2-2 ms from 8 to 96 kHz (most
of its values zero: 44.1 kHz's 475 x 160 kernel reaches ~35 inputs a filter), the banded one
0.1-0.6 ms, equal to torchaudio's output within 1e-6. Pairs of rates whose kernel would exceed
MAX_KERNEL values (rates sharing no large divisor: 44100 to 16001) return None, and the caller uses swr.
"""

from __future__ import annotations

import functools
import math

import numpy as np

ZERO_CROSSINGS = 6  # torchaudio's lowpass_filter_width
ROLLOFF = 0.99
MAX_KERNEL = 1 << 22  # values of a cached kernel (16 MB of float32): 44.1/48/22.05/11.025/8 kHz to 16 kHz need at most 0.3 M
# Multiply-adds of one matrix product: OpenBLAS runs a product under 4 x 65536 of them on the calling
# thread; a bigger one starts a thread a core, which in a worker spin against the other workers
# (3-20 ms a 2 s crop, against 0.2-1.2 ms in pieces this size). torch's product would be quick too,
# but torch's thread pool hangs in a worker forked after the training process used it.
SINGLE_THREAD_PRODUCT = 200_000
STRIDE_REACH = 3  # a block holds at least this many times the kernel's reach (its padding) of inputs
PIECES = 16  # groups of output columns, each multiplied by the rows where its filters reach
PIECE_COLUMNS = 8  # columns a group at least (each group is a call: more, smaller ones cost more than they save)


@functools.lru_cache(maxsize=16)
def sinc_kernel(orig: int, new: int) -> tuple[np.ndarray, int] | None:
    """(the (width, new) float32 kernel, the padding before the input) for rates reduced to ``orig``
    and ``new``; None when it would hold more than MAX_KERNEL values."""
    base = min(orig, new) * ROLLOFF
    pad = math.ceil(ZERO_CROSSINGS * orig / base)
    if new * (2 * pad + orig) > MAX_KERNEL:
        return None
    taps = np.arange(-pad, pad + orig, dtype=np.float64)[None, :] / orig
    t = (np.arange(0, -new, -1, dtype=np.float64)[:, None] / new + taps) * base
    t = np.clip(t, -ZERO_CROSSINGS, ZERO_CROSSINGS)
    window = np.cos(t * math.pi / ZERO_CROSSINGS / 2) ** 2
    t *= math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        kernel = np.where(t == 0, 1.0, np.sin(t) / t) * window * (base / orig)
    return np.ascontiguousarray(kernel.T, dtype=np.float32), pad  # writable: torch.from_numpy warns on a read-only array


@functools.lru_cache(maxsize=16)
def banded_kernel(orig: int, new: int) -> tuple[tuple[tuple[int, int, int, int, np.ndarray], ...], int, int, int] | None:
    """The kernel of ``orig`` to ``new`` reshaped for speed: (its pieces as (first row, end row, first
    column, end column, values), the padding before the input, the input a block, the window a block);
    None where :func:`sinc_kernel` gives none.

    A block of STRIDE_BLOCKS blocks of ``orig`` inputs (torchaudio's kernel at ``s * orig`` to ``s * new``
    is its ``orig`` to ``new`` kernel shifted ``orig`` rows a further ``new`` columns), so that a block
    is longer than the kernel's reach and the blocks' windows overlap little; its ``s * new`` outputs
    in at most PIECES groups of columns, each multiplying only the rows where its filters are not zero (a
    filter reaches 6 zero crossings of the lower rate: ~35 of the 475 rows of 44.1 to 16 kHz)."""
    made = sinc_kernel(orig, new)
    if made is None:
        return None
    pad = made[1]
    scale = max(1, math.ceil(STRIDE_REACH * pad / orig))
    kernel = sinc_kernel(orig * scale, new * scale) if scale > 1 else made
    if kernel is None:
        return None
    values = kernel[0]
    reached = values != 0
    columns = values.shape[1]
    step = max(PIECE_COLUMNS, math.ceil(columns / PIECES))
    pieces = []
    for first in range(0, columns, step):
        end = min(columns, first + step)
        rows = np.flatnonzero(reached[:, first:end].any(axis=1))
        pieces.append((int(rows[0]), int(rows[-1]) + 1, first, end, np.ascontiguousarray(values[rows[0] : rows[-1] + 1, first:end])))
    return tuple(pieces), pad, orig * scale, values.shape[0]


def sinc_resample(samples: np.ndarray, rate: int, target_rate: int) -> np.ndarray | None:
    """``samples`` (C, n float32 at ``rate``) at ``target_rate``: ceil(n * target_rate / rate)
    samples a channel, the first at the input's first instant; None where the kernel is too big."""
    gcd = math.gcd(rate, target_rate)
    orig, new = rate // gcd, target_rate // gcd
    made = banded_kernel(orig, new)
    if made is None:
        return None
    pieces, pad, stride, window = made
    padded = np.pad(samples, ((0, 0), (pad, pad + stride)))
    out = []
    for channel in padded:  # each alike: equal channels stay equal (a product's rounding depends on its shape)
        blocks = np.lib.stride_tricks.sliding_window_view(channel, window)[::stride]
        if window > 2 * stride:  # windows overlapping a lot (few inputs a block): a product reads them copied
            blocks = np.ascontiguousarray(blocks)
        result = np.empty((len(blocks), pieces[-1][3]), np.float32)
        for first, end, left, right, kernel in pieces:
            part = blocks[:, first:end]
            if end - first > stride:  # rows overlapping the next block's: not a matrix BLAS reads in place
                part = np.ascontiguousarray(part)
            rows = max(1, SINGLE_THREAD_PRODUCT // kernel.size)
            for i in range(0, len(part), rows):
                np.matmul(part[i : i + rows], kernel, out=result[i : i + rows, left:right])
        out.append(result.reshape(-1))
    return np.stack(out)[:, : math.ceil(new * samples.shape[1] / orig)]

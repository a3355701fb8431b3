"""A crop resampled by torchaudio's default recipe (``torchaudio.functional.resample``: a windowed
sinc, Hann window, 6 zero crossings, cut-off at 0.99 of the lower Nyquist rate), as one matrix
product per crop: the input in blocks of ``orig`` samples (the rates divided by their greatest
common divisor) times a kernel of ``new`` filters made once per pair of rates (in pieces small
enough for one thread: SINGLE_THREAD_PRODUCT).

Measured against FFmpeg's swr through PyAV on 2 s crops to 16 kHz: swr sets up a filter graph per
crop (1-2 ms, as much as decoding the crop); this takes 0.2-1.2 ms from 8 to 96 kHz, equal to
torchaudio's output within 1e-7. Pairs of rates whose kernel would exceed MAX_KERNEL values (rates
sharing no large divisor: 44100 to 16001) return None, and the caller uses swr.
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


def sinc_resample(samples: np.ndarray, rate: int, target_rate: int) -> np.ndarray | None:
    """``samples`` (C, n float32 at ``rate``) at ``target_rate``: ceil(n * target_rate / rate)
    samples a channel, the first at the input's first instant; None where the kernel is too big."""
    gcd = math.gcd(rate, target_rate)
    orig, new = rate // gcd, target_rate // gcd
    made = sinc_kernel(orig, new)
    if made is None:
        return None
    kernel, pad = made
    padded = np.pad(samples, ((0, 0), (pad, pad + orig)))
    rows = max(1, SINGLE_THREAD_PRODUCT // kernel.size)
    out = []
    for channel in padded:  # each alike: equal channels stay equal (a product's rounding depends on its shape)
        blocks = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(channel, kernel.shape[0])[::orig])
        out.append(np.concatenate([blocks[i : i + rows] @ kernel for i in range(0, len(blocks), rows)]).reshape(-1))
    return np.stack(out)[:, : math.ceil(new * samples.shape[1] / orig)]

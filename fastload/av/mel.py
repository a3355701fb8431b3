"""Whisper's log-mel features, computed in the workers: a 400-sample periodic Hann window every 160
samples (the recording reflected at its ends, the last frame dropped), power spectra through
Slaney's mel filters (librosa's ``filters.mel(sr=16000, n_fft=400)``, which Whisper ships as
``mel_filters.npz``), log10 floored at 1e-10 and at 8 below the crop's peak, then ``(x + 4) / 4``
(openai-whisper's ``log_mel_spectrogram``), in float64 and stored as float32."""

from __future__ import annotations

import functools

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / (200.0 / 3)
    log_part = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log_part, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_hz_to_mel`."""
    mel = np.asarray(mel, dtype=np.float64)
    return np.where(mel >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0)), mel * (200.0 / 3))


@functools.lru_cache(maxsize=4)
def mel_filters(bins: int) -> np.ndarray:
    """(bins, N_FFT // 2 + 1) triangular filters from 0 Hz to 8 kHz, each of unit area (Slaney's norm)."""
    frequencies = np.linspace(0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(SAMPLE_RATE / 2)), bins + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - frequencies[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    filters = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (edges[2:] - edges[:-2]))[:, None]
    filters.flags.writeable = False
    return filters


@functools.lru_cache(maxsize=1)
def _window() -> np.ndarray:
    """The periodic Hann window torch.hann_window(400) gives."""
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)


def log_mel(samples: np.ndarray, bins: int, out: np.ndarray) -> None:
    """Whisper's log-mel features of ``samples`` (n float32 at 16 kHz) into ``out`` (bins, n // HOP)."""
    if samples.shape[-1] <= N_FFT // 2:
        raise ValueError(f"a crop of {samples.shape[-1]} samples is too short for log-mel features (more than {N_FFT // 2})")
    padded = np.pad(samples.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][: out.shape[-1]]
    power = np.abs(np.fft.rfft(frames * _window(), axis=-1)) ** 2
    spectrum = np.log10(np.maximum(mel_filters(bins) @ power.T, 1e-10))
    spectrum = np.maximum(spectrum, spectrum.max() - 8.0)
    out[...] = (spectrum + 4.0) / 4.0

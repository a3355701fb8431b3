"""How the hybrid backend splits a batch between DALI and the CPU workers: in proportion to the two
engines' measured rates, updated from every batch's timings.

A batch is ready when both parts are. The training process waits for DALI's part, then for the
CPU's; the engine it waited on longer was the one holding the batch back, and while it is behind
it works without pause, so its part's size over the time since the previous batch is its rate.
The other engine kept up: its rate is at least its part over that time, and its estimate grows a
little with each such batch until it becomes the one waited on and is measured in turn, so the
split settles around the balance (within a few percent) instead of sticking where it started.
Batches where neither engine was waited on (the training step is slower than the loader) say
nothing about the engines and leave the split as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_SHARE = 0.05  # each engine keeps at least this share, so both stay measured
SMOOTHING = 0.25  # weight of a new measurement of the engine waited on
GROWTH = 1.01  # per batch, the estimate of the engine that kept up
IDLE_WAIT = 0.05  # waits below this share of the batch interval: the loader was ahead, no information


@dataclass
class SplitController:
    """Rates (images/s) of DALI and of the CPU workers, and the split they give."""

    dali_rate: float = 1.0
    cpu_rate: float = 1.0

    def share(self) -> float:
        """DALI's share of a batch: its rate over both rates, each engine keeping MIN_SHARE."""
        share = self.dali_rate / (self.dali_rate + self.cpu_rate)
        return min(1 - MIN_SHARE, max(MIN_SHARE, share))

    def dali_count(self, samples: int) -> int:
        """How many of a batch's ``samples`` DALI decodes: at least one (DALI's batches are never
        empty), the rest to the CPU workers."""
        return max(1, min(samples, round(samples * self.share())))

    def observe(self, dali_samples: int, cpu_samples: int, dali_wait: float, cpu_wait: float, interval: float) -> None:
        """One batch: each engine's part, how long the training process waited for each part, and
        the time since the previous batch was ready."""
        if interval <= 0 or max(dali_wait, cpu_wait) < IDLE_WAIT * interval:
            return
        if dali_wait >= cpu_wait:
            self.dali_rate = _smoothed(self.dali_rate, dali_samples / interval)
            self.cpu_rate = max(self.cpu_rate, cpu_samples / interval) * GROWTH
        else:
            self.cpu_rate = _smoothed(self.cpu_rate, cpu_samples / interval)
            self.dali_rate = max(self.dali_rate, dali_samples / interval) * GROWTH


def _smoothed(old: float, new: float) -> float:
    return (1 - SMOOTHING) * old + SMOOTHING * new

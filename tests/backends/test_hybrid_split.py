"""The hybrid split's controller against two simulated engines of known speed: each decodes its
parts one after another, starting a batch only once its share is published (``lead`` batches
before the training process needs it, as the hybrid epoch does), and the training process waits
for DALI's part and then the CPU's, as the hybrid epoch does. The split must settle in proportion
to the rates, and the loader deliver about the sum of the two engines' rates."""

from __future__ import annotations

import statistics

import pytest

from fastload.backends.hybrid.split import MIN_SHARE, SplitController


def simulate(dali_rate: float, cpu_rate: float, lead: int, batch: int = 256, batches: int = 400) -> tuple[list[float], float]:
    """(DALI's share of each batch published, the loader's images/s over the last 300 batches)."""
    controller = SplitController()
    counts = [controller.dali_count(batch) for _ in range(lead)]
    shares: list[float] = []
    dali_free = cpu_free = now = previous = 0.0
    ready_at: list[float] = []
    for batch_no in range(batches):
        published_at = ready_at[batch_no - lead] if batch_no >= lead else 0.0
        dali = counts[batch_no]
        dali_free = max(dali_free, published_at) + dali / dali_rate
        cpu_free = max(cpu_free, published_at) + (batch - dali) / cpu_rate
        got_dali = max(now, dali_free)
        ready = max(got_dali, cpu_free)
        if batch_no:
            controller.observe(dali, batch - dali, got_dali - now, ready - got_dali, ready - previous)
        previous = now = ready
        ready_at.append(ready)
        counts.append(controller.dali_count(batch))
        shares.append(controller.share())
    return shares, batch * 300 / (ready_at[-1] - ready_at[-301])


@pytest.mark.parametrize("dali_rate, cpu_rate", [(27000, 12600), (1000, 3000), (500, 500), (150, 2000)])
@pytest.mark.parametrize("lead", [2, 17])
def test_the_split_follows_the_engines_rates(dali_rate: float, cpu_rate: float, lead: int) -> None:
    shares, rate = simulate(dali_rate, cpu_rate, lead)
    ideal = max(MIN_SHARE, dali_rate / (dali_rate + cpu_rate))
    assert abs(statistics.mean(shares[-200:]) - ideal) < 0.05, (statistics.mean(shares[-200:]), ideal)
    assert rate >= 0.93 * (dali_rate + cpu_rate), rate / (dali_rate + cpu_rate)


def test_without_waits_the_split_stays_where_it_is() -> None:
    """A training step slower than the loader: neither engine is waited on, nothing is learnt."""
    controller = SplitController(dali_rate=3.0, cpu_rate=1.0)
    for _ in range(50):
        controller.observe(192, 64, dali_wait=0.0, cpu_wait=0.0001, interval=0.5)
    assert controller.share() == 0.75 and controller.dali_count(256) == 192


def test_dali_always_gets_a_sample_and_each_engine_its_minimum() -> None:
    controller = SplitController(dali_rate=1.0, cpu_rate=1000.0)
    assert controller.share() == MIN_SHARE and controller.dali_count(3) == 1 and controller.dali_count(256) == 13
    assert SplitController(dali_rate=1000.0, cpu_rate=1.0).dali_count(256) == 243

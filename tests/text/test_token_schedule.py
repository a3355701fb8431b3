"""fastload.WeightSchedule with fastload.mix(by="tokens"): the members' shares of the tokens follow
the schedule over every window, describe names the weights in force, and a resume (also at another
world size) across the change delivers the uninterrupted run's rows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import fastload
from tests.text.test_token_loader import BLOCK, SEQ, member_of, rows_of_ranks, token_member, tokens  # noqa: F401 - a fixture

STAGES = [(0, [0.9, 0.1]), (200_000, [0.2, 0.8]), (400_000, [0.5, 0.5])]  # tokens of the run


@pytest.fixture
def mixture(tokens: Path, tokenizer_file: Path, tmp_path: Path) -> fastload.MixedDataset:  # noqa: F811
    return fastload.mix([str(tokens), str(token_member(tokenizer_file, tmp_path))], by="tokens", weights=fastload.WeightSchedule(STAGES))


@pytest.mark.parametrize("interpolate", ["linear", "constant"])
def test_the_token_shares_are_within_half_a_point_of_the_schedule_over_every_window(tokens: Path, tokenizer_file: Path,  # noqa: F811
                                                                                    tmp_path: Path, interpolate: str) -> None:
    """About 800K tokens (epochs of ~270K, through both changes): over every window of 1,000 rows
    (128K tokens), sliding by a row, the first member's share of the tokens is within 0.5 points of
    the schedule's mean weight there, and after any number of rows within 2 rows of the schedule's
    running total; every row is one member's; describe gives the weights in force at each row."""
    schedule = fastload.WeightSchedule(STAGES, interpolate=interpolate)
    mixture = fastload.mix([str(tokens), str(token_member(tokenizer_file, tmp_path))], by="tokens", weights=schedule)
    ld = fastload.DataLoader(mixture, batch_size=32, seq_len=SEQ, block_tokens=BLOCK, seed=4, num_workers=1)
    first: list[bool] = []
    epoch = 0
    while len(first) * SEQ < 800_000:
        for step, batch in enumerate(ld):
            for used, segments in zip(batch["attention_mask"].sum(dim=1).tolist(), ld.describe(step, epoch)):
                if used:
                    owners = {member_of(s, tokens) for s in segments}
                    assert len(owners) == 1 and used == SEQ  # a row: seq_len tokens of one member
                    assert segments[0]["weights"] == pytest.approx(schedule.weights_at(len(first) * SEQ))
                    first.append(owners.pop() == 0)
        epoch += 1
    ld.close()
    delivered = np.asarray(first, dtype=np.float64)
    wanted = np.asarray([schedule.mean_weights(r * SEQ, (r + 1) * SEQ)[0] for r in range(len(first))])
    window = 1_000
    shares = np.convolve(delivered, np.ones(window), "valid") / window
    assert len(shares) > 5_000 and np.abs(shares - np.convolve(wanted, np.ones(window), "valid") / window).max() <= 0.005
    assert np.abs(np.cumsum(delivered) - np.cumsum(wanted)).max() <= 2


@pytest.mark.parametrize("world_after", [1, 3])
def test_a_resume_at_another_world_size_across_the_change_delivers_the_epochs_rows_once(mixture: fastload.MixedDataset,
                                                                                      world_after: int) -> None:
    """Epoch 0 runs through the change at 200K tokens: two ranks save after 4 steps; resumed at 1
    or 3 ranks, the rows before and after are the uninterrupted epoch's, each once."""
    def ranks(world: int, state: dict | None = None, steps: int | None = None) -> tuple[Counter, dict]:
        return rows_of_ranks(lambda rank: fastload.DataLoader(mixture, batch_size=4, seq_len=SEQ, block_tokens=BLOCK, seed=3,
                                                              rank=rank, world_size=world), world, state, steps)

    before, state = ranks(2, steps=40)
    assert state["samples_consumed"] == 40 * 2 * 4
    after, _ = ranks(world_after, state=state)
    assert before + after == ranks(1)[0]


def test_a_token_state_is_refused_by_a_mixture_of_another_schedule(mixture: fastload.MixedDataset) -> None:
    state = fastload.DataLoader(mixture, batch_size=4, seq_len=SEQ, block_tokens=BLOCK).state_dict()
    fastload.DataLoader(mixture, batch_size=4, seq_len=SEQ, block_tokens=BLOCK).load_state_dict(state)
    paths = [m.location for m in mixture.members]
    for other in (fastload.mix(paths, by="tokens", weights=fastload.WeightSchedule(STAGES, interpolate="constant")),
                  fastload.mix(dict(zip(paths, STAGES[0][1], strict=True)), by="tokens")):
        with pytest.raises(ValueError, match="another dataset"):
            fastload.DataLoader(other, batch_size=4, seq_len=SEQ, block_tokens=BLOCK).load_state_dict(state)

"""The token loader inside real training frameworks, each training a small GPT-2 made from a config:
Lightning DDP (2 CPU processes), Accelerate under torchrun (2 processes), Hugging Face's Trainer
through a ``get_train_dataloader`` override; each resumes mid-epoch with exactly the batches an
uninterrupted run trains on next."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import fastload
from tests.conftest import run_script, torchrun
from tests.text.conftest import paragraph_shards

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
HERE = Path(__file__).parent.parent / "frameworks"


@pytest.fixture(scope="module")
def small_tokens(tokenizer_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 real paragraphs with eos in shards of about 3,000 tokens (about 14,000 tokens)."""
    return paragraph_shards(tmp_path_factory.mktemp("lm"), tokenizer_file, 120, 3000)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def epoch_rows(path: Path) -> int:
    """Rows holding tokens in an epoch of the scripts' packing (one rank, counted from real batches)."""
    loader = fastload.DataLoader(str(path), batch_size=8, seq_len=64, packing="best-fit", block_tokens=4096)
    return sum(int(b["attention_mask"].any(dim=1).sum()) for b in loader)


def test_lightning_ddp_trains_shards_reshuffles_and_resumes(small_tokens: Path, tmp_path: Path) -> None:
    whole, split = tmp_path / "whole", tmp_path / "split"
    whole.mkdir(), split.mkdir()
    run_script([sys.executable, str(HERE / "lightning_lm.py"), str(small_tokens), str(whole)], timeout=400)
    rows = {rank: read_jsonl(whole / f"rank{rank}.jsonl") for rank in (0, 1)}
    by_epoch = {(rank, epoch): [r["batch"] for r in rows[rank] if r["epoch"] == epoch] for rank in (0, 1) for epoch in (0, 1)}
    steps = len(by_epoch[(0, 0)])
    assert steps == len(by_epoch[(1, 0)]) == -(-epoch_rows(small_tokens) // 8)  # every rank the loader's steps, 4 rows each
    assert not set(by_epoch[(0, 0)]) & set(by_epoch[(1, 0)])  # the ranks read different rows
    assert by_epoch[(0, 0)] != by_epoch[(0, 1)]  # a new order every epoch
    losses = [r["loss"] for r in rows[0]]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1  # it learns
    # preempted after step 3 (mid-epoch 0): resume from that checkpoint in a new run
    run_script([sys.executable, str(HERE / "lightning_lm.py"), str(small_tokens), str(split), str(whole / "step=3.ckpt")], timeout=400)
    for rank in (0, 1):
        resumed = read_jsonl(split / f"rank{rank}.jsonl")
        assert [r["batch"] for r in resumed if r["epoch"] == 0] == by_epoch[(rank, 0)][3:]  # exactly the rest of epoch 0
        assert [r["batch"] for r in resumed if r["epoch"] == 1] == by_epoch[(rank, 1)]


def test_accelerate_under_torchrun(small_tokens: Path, tmp_path: Path) -> None:
    run_script(torchrun(HERE / "accelerate_lm.py", str(small_tokens), str(tmp_path)), timeout=400)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    rows = epoch_rows(small_tokens)
    for report in reports:
        steps = report["batches"]
        assert report["prepared_is_fastload"] and steps == -(-rows // 8)
        assert report["syncs"] == [(i + 1) % 4 == 0 or i + 1 == steps for i in range(steps)]  # and on the epoch's last batch
        assert report["val_rows"] == rows and report["val_tokens"] == fastload.open(small_tokens).index.num_tokens  # padding rows hold no tokens
        assert report["resumed_equal"] and report["skip_equal"]
        assert sum(report["losses"][-4:]) < sum(report["losses"][:4]) - 1
    assert not set(reports[0]["epoch1"]) & set(reports[1]["epoch1"])  # the ranks share the epoch


def test_hugging_face_trainer_trains_and_resumes_through_a_dataloader_override(small_tokens: Path, tmp_path: Path) -> None:
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    whole.mkdir(), resumed.mkdir()
    run_script([sys.executable, str(HERE / "trainer_lm.py"), str(small_tokens), str(whole), "40"], timeout=400)
    losses = json.loads((whole / "losses.json").read_text())
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5  # logged every 5 steps: it learns
    steps = read_jsonl(whole / "steps.jsonl")
    assert [s["step"] for s in steps] == list(range(40)) and len({s["batch"] for s in steps}) == 40
    run_script([sys.executable, str(HERE / "trainer_lm.py"), str(small_tokens), str(resumed), "40", str(whole / "run" / "checkpoint-20")], timeout=400)
    assert read_jsonl(resumed / "steps.jsonl") == steps[20:]  # Trainer's own resume: the batches it had not trained on

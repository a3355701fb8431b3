"""examples/train_lm.py under torchrun (2 gloo ranks): a GPT-2 made from a config learns from packed
token rows, is killed mid-epoch, and resumes with exactly the batches an uninterrupted run reads."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fastload.converters import ConvertOptions, convert
from fastload.converters.convert_options import TokenizeOptions
from tests.conftest import cli_env, kill_like_a_dying_machine
from tests.text.conftest import real_paragraphs, write_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SCRIPT = Path(__file__).parent.parent.parent / "examples" / "train_lm.py"


@pytest.fixture(scope="module")
def lm_tokens(tokenizer_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("train-lm")
    write_jsonl(root / "docs.jsonl", real_paragraphs())
    convert(str(root / "docs.jsonl"), str(root / "ds"), ConvertOptions(
        source="jsonl", layout="tokens", tokens=TokenizeOptions(str(tokenizer_file), append_eos=True, shard_tokens=50_000)), quiet=True)
    return root / "ds"


def torchrun(data: Path, ckpt: Path, log: Path, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT), "--data", str(data),
            "--steps", str(steps), "--seq-len", "128", "--batch-size", "4", "--workers", "1", "--width", "64",
            "--checkpoint-dir", str(ckpt), "--checkpoint-every", "10", "--log-batches", str(log), *extra]


def batches(log: Path) -> dict[tuple[int, int], str]:
    """(step, rank) -> the digest of that step's batch on that rank, from both ranks' logs."""
    out = {}
    for rank in (0, 1):
        for line in log.with_name(f"{log.name}.{rank}").read_text().splitlines():
            step, r, digest = line.split()
            out[(int(step), int(r))] = digest
    return out


def test_learns_is_killed_and_resumes_the_token_stream_exactly(lm_tokens: Path, tmp_path: Path) -> None:
    whole = subprocess.run(torchrun(lm_tokens, tmp_path / "ckpt-whole", tmp_path / "whole", 60), capture_output=True, text=True,
                           timeout=300, env=cli_env())
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"step \d+: loss ([\d.]+)", whole.stdout)]
    assert len(losses) == 7 and losses[-1] < losses[0] - 1, whole.stdout  # from ln(2000) ~ 7.6: it learns

    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(torchrun(lm_tokens, ckpt, tmp_path / "killed", 1000), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env=cli_env())
    deadline, step = time.monotonic() + 240, 0
    while time.monotonic() < deadline and proc.poll() is None and step < 20:
        if (ckpt / "last.pt").exists():
            try:
                step = torch.load(ckpt / "last.pt", weights_only=False)["step"]
            except Exception:
                step = 0  # caught mid-rename; look again
        time.sleep(0.05)
    assert proc.poll() is None, "training ended before it could be killed"
    kill_like_a_dying_machine(proc)  # torchrun and its ranks: a dying machine
    saved = torch.load(ckpt / "last.pt", weights_only=False)["step"]
    assert 20 <= saved < 60

    resumed = subprocess.run(torchrun(lm_tokens, ckpt, tmp_path / "resumed", 60, "--resume"), capture_output=True, text=True,
                             timeout=300, env=cli_env())
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resumed from step {saved}" in resumed.stdout
    reference, after = batches(tmp_path / "whole"), batches(tmp_path / "resumed")
    assert after == {key: digest for key, digest in reference.items() if key[0] >= saved}  # every later step, both ranks, as uninterrupted
    assert batches(tmp_path / "killed").items() >= {key: d for key, d in reference.items() if key[0] < saved}.items()

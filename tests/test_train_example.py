"""examples/train_ddp.py under torchrun (2 gloo ranks): it trains, is killed, and resumes."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fastload.cli.demo import make_demo_images
from fastload.converters import ConvertOptions, convert
from tests.conftest import cli_env, kill_like_a_dying_machine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SCRIPT = Path(__file__).parent.parent / "examples" / "train_ddp.py"


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("train")
    make_demo_images(root / "raw", 200)
    convert(str(root / "raw"), str(root / "wds"), ConvertOptions(source="imagefolder", samples_per_shard=50, reencode_quality=90, max_size=64))
    return root / "wds"


def torchrun(data: Path, ckpt: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
        "--data", str(data), "--epochs", "5", "--batch-size", "8", "--workers", "1", "--image-size", "32",
        "--checkpoint-dir", str(ckpt), "--checkpoint-every", "4", "--patience", "10", *extra,
    ]


def test_trains_is_killed_and_resumes(small_dataset: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(torchrun(small_dataset, ckpt), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=cli_env())
    deadline = time.monotonic() + 120
    step = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if (ckpt / "last.pt").exists():
            try:
                step = torch.load(ckpt / "last.pt", weights_only=False)["step"]
            except Exception:
                step = 0  # caught mid-rename; look again
            if step >= 16:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "training ended before it could be killed"
    kill_like_a_dying_machine(proc)  # torchrun and its ranks: a dying machine
    saved = torch.load(ckpt / "last.pt", weights_only=False)
    assert 16 <= saved["step"] < 65 and saved["loader"]["samples_consumed"] % 16 == 0

    resumed = subprocess.run(torchrun(small_dataset, ckpt, "--resume"), capture_output=True, text=True, timeout=240, env=cli_env())
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out
    assert f"resumed from step {saved['step']}" in out
    epochs = re.findall(r"epoch (\d): loss .* val acc .* images/s .* \(step (\d+)\)", out)
    assert epochs and epochs[-1] == ("4", "65"), out  # 200 / (8 x 2) = 13 steps per epoch, as uninterrupted
    assert "done: best val acc" in out
    assert re.search(r"epoch 4: \d+ samples in \d+ batches, .* of work: read \d+%, decode \d+%", out)  # loader.stats by stage
    assert "\nverdict: " in out


def test_quickstart_runs(image_folder: Path, tmp_path: Path) -> None:
    script = Path(__file__).parent.parent / "examples" / "quickstart.py"
    proc = subprocess.run([sys.executable, str(script), str(image_folder), str(tmp_path / "wds")], capture_output=True, text=True, timeout=120, env=cli_env())
    assert proc.returncode == 0, proc.stderr
    assert "30 images of ['circles', 'squares', 'stripes', 'waves']" in proc.stdout
    assert "(30, 3, 224, 224) torch.float32" in proc.stdout

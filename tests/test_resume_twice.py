"""Resume twice (the peers' users' top complaint: HF datasets #8308, LitData #775, Streaming #880):
one training run under torchrun, with worker processes, is killed like a dying machine (SIGKILL of
the launcher, its ranks and their workers) a few steps after a checkpoint, resumed at another world
size, killed again, and resumed at a third: the steps each launch ran up to the checkpoint the
next one resumed from hold every token (every sample) of the epoch exactly once, each token's id
the one stored there."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import cli_env, kill_like_a_dying_machine
from tests.test_distributed import all_keys, dataset_1001  # noqa: F401 - a fixture
from tests.text.conftest import tokenizer_file  # noqa: F401 - a fixture
from tests.text.test_token_loader import every_position, tokens  # noqa: F401 - a fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SCRIPT = Path(__file__).with_name("resume_twice_run.py")
EVERY = 5  # steps between saves
LAUNCHES = [(2, 13), (3, 27), (1, None)]  # (world size, the step it hangs at to be killed): saved at 10, then at 25


def launch(run: Path, number: int, world: int, hang_at: int | None, data: Path, kind: str, packing: str) -> None:
    """One launch of the run on ``world`` ranks: to its end, or killed once every rank hangs at ``hang_at``."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", str(SCRIPT), "--data", str(data),
               "--kind", kind, "--packing", packing, "--folder", str(run), "--launch", str(number), "--every", str(EVERY),
               *(["--hang-at", str(hang_at)] if hang_at is not None else [])]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=cli_env())
    if hang_at is None:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output[-4000:]
        return
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None and len(list(run.glob(f"hung-{number}-*"))) < world:
        time.sleep(0.05)
    assert proc.poll() is None, (proc.stdout.read() if proc.stdout else "")[-4000:]  # it ran on to the hang, not to an end
    kill_like_a_dying_machine(proc)


def saved_at(hang_at: int | None) -> int | None:
    """The step of the last save before a launch hanging at ``hang_at``, which the next launch resumes from."""
    return None if hang_at is None else hang_at // EVERY * EVERY


def kept_steps(run: Path) -> list[list]:
    """The batches of each launch's steps up to the checkpoint the next launch resumed from (those
    after it were lost with the machine and run again), over all ranks."""
    kept = []
    for number, (_, hang_at) in enumerate(LAUNCHES):
        end, lost = saved_at(hang_at), 0
        for log in sorted(run.glob(f"launch{number}-rank*.jsonl")):
            for line in log.read_text().splitlines():
                entry = json.loads(line)
                if end is None or entry["step"] < end:
                    kept.append(entry["batch"])
                else:
                    lost += 1
        assert end is None or lost > 0, "the kill came with steps after the checkpoint, which the next launch runs again"
    return kept


def run_three_times(run: Path, data: Path, kind: str, packing: str = "concat") -> list[list]:
    for number, (world, hang_at) in enumerate(LAUNCHES):
        launch(run, number, world, hang_at, data, kind, packing)
        if hang_at is not None:
            assert json.loads((run / "checkpoint.json").read_text())["step"] == saved_at(hang_at)
    return kept_steps(run)


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_a_token_run_killed_twice_and_resumed_at_two_world_sizes_reads_every_token_once(tokens: Path, tmp_path: Path,  # noqa: F811
                                                                                       packing: str) -> None:
    kept = run_three_times(tmp_path, tokens, "tokens", packing)
    seen: Counter = Counter()
    ids: dict = {}
    for batch in kept:
        for row in batch:
            for shard, document, offset, delivered in row:
                for i, token in enumerate(delivered):
                    seen[(shard, document, offset + i)] += 1
                    ids[(shard, document, offset + i)] = token
    stored = every_position(tokens)
    assert set(seen) == set(stored) and set(seen.values()) == {1}  # every token position of the epoch, once
    assert ids == stored  # the id delivered at each is the one stored there


def test_an_image_run_killed_twice_and_resumed_at_two_world_sizes_reads_every_sample_once(dataset_1001: Path, tmp_path: Path) -> None:  # noqa: F811
    kept = run_three_times(tmp_path, dataset_1001, "images")
    real = [key for batch in kept for key, ok in batch if ok]
    assert Counter(real) == Counter(all_keys(dataset_1001))  # every sample of the epoch once (padding marked, not counted)

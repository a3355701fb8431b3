"""Failure behaviour with real processes and real signals: corrupt samples raise (naming shard and
key) or are skipped and counted; a dead or hung worker is an error, never a hang; nothing leaks
after a normal end, a break, an exception or Ctrl-C; memory stays flat across epochs."""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.errors import SampleError
from fastload.formats.idx import parse_dali_index
from fastload.formats.index import read_index
from fastload.workers.pool import WorkerError
from tests.conftest import alive, cli_env, collection_page_faults, photo_folder


def worker_pids(loader: fastload.DataLoader) -> list[int]:
    return [p.pid for p in loader.kind.engine.pool.processes]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_corrupt_sample_raises_naming_shard_and_key(corrupt: tuple[Path, set[str]], num_workers: int) -> None:
    path, bad = corrupt
    with fastload.DataLoader(path, batch_size=4, num_workers=num_workers, transform=T.val(16)) as loader:
        with pytest.raises(SampleError) as info:
            list(loader)
    assert info.value.where.startswith("shard-00001.tar:")
    assert info.value.where.split(":", 1)[1] in bad


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_keeps_batch_size_and_counts(corrupt: tuple[Path, set[str]], num_workers: int) -> None:
    path, bad = corrupt
    with fastload.DataLoader(path, batch_size=4, num_workers=num_workers, transform=T.val(16), on_error="skip", return_keys=True) as loader:
        batches = list(loader)
        assert [len(k) for _, _, k in batches] == [4] * 7 + [2]
        keys = [k for _, _, ks in batches for k in ks]
        assert not bad & set(keys)
        assert len(loader.stats.skipped) == 2
        assert {e["where"].split(":", 1)[1] for e in loader.stats.skipped.entries} == bad


@pytest.fixture(scope="module")
def cut_shard(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """Two shards of 100 small photos; the first cut to 30% of its bytes: ~70 bad samples in a
    row (more than the 64 substitutes on_error='skip' used to try). Returns (path, bad count)."""
    root = tmp_path_factory.mktemp("cut")
    convert(str(photo_folder(root / "raw", 200, (24, 32))), str(root / "ds"), ConvertOptions(source="imagefolder", samples_per_shard=100))
    shard = root / "ds" / read_index(root / "ds").shards[0].path
    data = shard.read_bytes()
    shard.write_bytes(data[: int(len(data) * 0.3)])
    members = parse_dali_index((root / "ds" / read_index(root / "ds").shards[0].offsets).read_text(), "idx")
    bad = sum(1 for row in range(100) if max(offset + size for offset, size in members.spans(row).values()) > len(data) * 0.3)
    return root / "ds", bad


@pytest.mark.parametrize(("backend", "num_workers"), [("cpu", 0), ("cpu", 2), ("dali", 2)])
def test_skip_passes_a_long_run_of_bad_samples_and_counts_each_once(cut_shard: tuple[Path, int], backend: str, num_workers: int) -> None:
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    path, bad = cut_shard
    assert bad > 64
    with fastload.DataLoader(path, batch_size=16, num_workers=num_workers, transform=T.val(16), on_error="skip",
                             max_skipped=0.5, return_keys=True, backend=backend) as loader:
        for _ in range(2):  # the second epoch meets the same bad samples
            batches = list(loader)
            assert [len(keys) for _, _, keys in batches] == [16] * 12 + [8]  # the epoch ends where it should, batches full
            assert len({k for _, _, keys in batches for k in keys}) == 200 - bad  # every readable sample, stand-ins repeating some
            assert len(loader.stats.skipped) == bad  # once each, whatever the epochs and the searches passing them
            assert len({e["where"] for e in loader.stats.skipped.entries}) == bad


@pytest.mark.parametrize("num_workers", [0, 2])
def test_max_skipped_bounds_an_epoch_by_count_or_share(cut_shard: tuple[Path, int], corrupt: tuple[Path, set[str]], num_workers: int) -> None:
    path, bad = cut_shard
    kwargs = dict(batch_size=4, num_workers=num_workers, transform=T.val(16), on_error="skip")
    with pytest.raises(SampleError, match=rf"{bad} unreadable samples in a row from here: more than max_skipped= lets "
                                          rf"on_error='skip' pass over \({bad - 1}\)$"):
        list(fastload.DataLoader(path, max_skipped=bad - 1, **kwargs))
    assert len(list(fastload.DataLoader(path, max_skipped=bad, **kwargs))) == 50
    corrupt_path, _ = corrupt  # two bad samples apart: the epoch's count, in the training process, bounds them
    for max_skipped, allowed in ((1, False), (2, True), (0.05, True), (0.03, False)):  # of 30 samples: ceil(1.5) = 2, ceil(0.9) = 1
        loader = fastload.DataLoader(corrupt_path, max_skipped=max_skipped, **kwargs)
        if allowed:
            assert sum(len(images) for images, _ in loader) == 30
            continue
        with pytest.raises(SampleError, match=rf"and on_error='skip' has skipped 2 samples this epoch, more than "
                                              rf"max_skipped={max_skipped} allows \(1\)$"):
            list(loader)
        assert sum(len(images) for images, _ in fastload.DataLoader(corrupt_path, max_skipped=None, **kwargs)) == 30


@pytest.mark.parametrize("value", [-1, 1.5, 0.0, True, "10%"])
def test_max_skipped_refuses_what_is_neither_a_count_nor_a_share(clean: Path, value: object) -> None:
    with pytest.raises(ValueError, match="max_skipped must be a count of samples"):
        fastload.DataLoader(clean, batch_size=4, transform=T.val(16), on_error="skip", max_skipped=value)


def test_max_skipped_of_none_all_or_nothing(corrupt: tuple[Path, set[str]]) -> None:
    """0: the first bad sample ends the epoch, named; 1.0 (the whole epoch) and None: both skipped."""
    path, bad = corrupt
    kwargs = dict(batch_size=4, transform=T.val(16), on_error="skip")
    with pytest.raises(SampleError, match=r"more than max_skipped= lets on_error='skip' pass over \(0\)$") as info:
        list(fastload.DataLoader(path, max_skipped=0, **kwargs))
    assert info.value.where.split(":", 1)[1] in bad
    for everything in (1.0, None):
        loader = fastload.DataLoader(path, max_skipped=everything, **kwargs)
        assert sum(len(images) for images, _ in loader) == 30 and len(loader.stats.skipped) == 2


@pytest.fixture(scope="module")
def bad_in_rank_0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 photos in one shard; samples 0, 8 and 16 with a garbage JPEG header: with a batch of 4
    over two ranks (in order), all three are rank 0's, among its 20 samples."""
    root = tmp_path_factory.mktemp("rank0")
    convert(str(photo_folder(root / "raw", 40, (24, 32))), str(root / "ds"), ConvertOptions(source="imagefolder", samples_per_shard=40))
    index = read_index(root / "ds")
    members = parse_dali_index((root / "ds" / index.shards[0].offsets).read_text(), "idx")
    shard = root / "ds" / index.shards[0].path
    data = bytearray(shard.read_bytes())
    for row in (0, 8, 16):
        offset, _ = members.spans(row)["jpg"]
        data[offset : offset + 16] = b"\xab" * 16
    shard.write_bytes(bytes(data))
    return root / "ds"


def test_a_share_of_max_skipped_is_of_the_ranks_epoch(bad_in_rank_0: Path) -> None:
    kwargs = dict(batch_size=4, transform=T.val(16), on_error="skip", rank=0, world_size=2)
    with pytest.raises(SampleError, match=r"has skipped 3 samples this epoch, more than max_skipped=0.1 allows \(2\)$"):
        list(fastload.DataLoader(bad_in_rank_0, max_skipped=0.1, **kwargs))  # a tenth of rank 0's 20 samples: 2
    assert sum(len(images) for images, _ in fastload.DataLoader(bad_in_rank_0, max_skipped=0.15, **kwargs)) == 20


def test_killed_worker_raises_within_seconds(clean: Path) -> None:
    loader = fastload.DataLoader(clean, batch_size=2, num_workers=2, transform=T.val(16), prefetch_factor=1)
    it = iter(loader)
    next(it)
    victim = loader.kind.engine.pool.processes[0]
    workers = worker_pids(loader)
    os.kill(victim.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=rf"pid {victim.pid}\) died: killed by SIGKILL"):
        for _ in it:
            time.sleep(0.05)
    assert time.monotonic() - start < 5
    loader.close()
    assert not alive(workers)


def slow_start(pid_dir: str, worker_id: int) -> None:
    Path(pid_dir, str(os.getpid())).touch()
    time.sleep(30)


def test_timeout_is_honoured_and_the_next_iteration_starts_promptly(clean: Path, tmp_path: Path) -> None:
    """A timeout stops the stuck workers; the next iteration starts fresh ones at once (it had
    waited 30 s for the old ones' answers)."""
    loader = fastload.DataLoader(clean, batch_size=2, num_workers=1, transform=T.val(16), timeout=1,
                                 worker_init_fn=functools.partial(slow_start, str(tmp_path)))
    for attempt in (1, 2):
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="within 1 s"):
            next(iter(loader))
        assert time.monotonic() - start < 4
        workers = [int(p.name) for p in tmp_path.iterdir()]
        assert len(workers) == attempt  # each attempt had its own worker ...
        assert not alive(workers)  # ... and none is left waiting
    loader.close()


def failing_init(worker_id: int) -> None:
    raise RuntimeError(f"no licence server for worker {worker_id}")


def test_worker_init_fn_error_reaches_the_training_process(clean: Path) -> None:
    with fastload.DataLoader(clean, batch_size=2, num_workers=2, transform=T.val(16), worker_init_fn=failing_init) as loader:
        with pytest.raises(WorkerError, match=r"(?s)worker_init_fn raised in worker \d.*RuntimeError: no licence server for worker \d"):
            next(iter(loader))


def test_batch_slots_that_cannot_be_allocated_say_how_much(clean: Path) -> None:
    """Under an address-space limit, the slots' allocation fails with the bytes it asked for."""
    script = f"""
import resource, fastload, fastload.transforms as T
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
loader = fastload.DataLoader({str(clean)!r}, batch_size=4096, num_workers=2, transform=T.val(512))
try:
    next(iter(loader))
except MemoryError as exc:
    print("MemoryError:", exc)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "cannot allocate the loader's batch slots: 6 slots of 3,221,258,240 bytes" in out.stdout, out.stdout + out.stderr
    assert "batch_size=4096, image 3x512x512 uint8" in out.stdout and "lower batch_size" in out.stdout


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("how", ["normal", "break", "exception"])
def test_nothing_leaks(clean: Path, how: str) -> None:
    shm_before = shm_entries()
    loader = fastload.DataLoader(clean, batch_size=3, num_workers=2, shuffle=True, transform=T.train(16))
    try:
        for i, _ in enumerate(loader):
            if how == "break" and i == 2:
                break
            if how == "exception" and i == 2:
                raise RuntimeError("training step failed")
    except RuntimeError:
        assert how == "exception"
    workers = worker_pids(loader)
    assert len(alive(workers)) == 2  # workers live as long as the loader, across epochs
    del loader
    gc.collect()
    deadline = time.monotonic() + 5
    while alive(workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(workers)
    assert shm_entries() == shm_before


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import fastload
    from fastload import transforms as T
    loader = fastload.DataLoader(sys.argv[1], batch_size=2, num_workers=2, transform=T.train(16))
    print("ready", flush=True)
    while True:
        for batch in loader:
            time.sleep(0.05)
    """
)


def test_ctrl_c_leaves_no_process_behind(clean: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(CTRL_C_SCRIPT)
    shm_before = shm_entries()
    # SIG_DFL in the child: a suite started with SIGINT ignored (nohup ... &) would pass the
    # ignoring on, and Python leaves an ignored SIGINT ignored instead of raising KeyboardInterrupt.
    proc = subprocess.Popen([sys.executable, str(script), str(clean)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=cli_env(), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    assert len(tree) == 3
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    proc.wait(timeout=15)
    assert "KeyboardInterrupt" in proc.stderr.read()
    deadline = time.monotonic() + 5
    while alive(tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(tree)
    assert shm_entries() == shm_before


def test_workers_exit_when_the_main_process_is_killed(clean: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(CTRL_C_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(clean)], stdout=subprocess.PIPE, text=True, start_new_session=True, env=cli_env())
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while alive(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(workers)


def tree_rss() -> int:
    me = psutil.Process()
    return me.memory_info().rss + sum(c.memory_info().rss for c in me.children(recursive=True))


def test_memory_does_not_grow_across_epochs(clean: Path) -> None:
    with fastload.DataLoader(clean, batch_size=4, num_workers=2, shuffle=True, transform=T.train(32)) as loader:
        samples = []
        for _ in range(8):
            for _ in loader:
                pass
            samples.append(tree_rss())
    growth = max(samples[3:]) - samples[2]
    assert growth < 8 * 2**20, [s / 2**20 for s in samples]


def test_workers_leave_the_inherited_heap_shared(clean: Path) -> None:
    """A garbage collection in a worker does not write to the objects it inherited, which would copy
    every page of the parent's heap (with torch imported: 11k page faults, ~100 ms for a fresh
    worker's first sample)."""
    heap = [[i] for i in range(500_000)]  # ~50 MB of collectable objects in the parent
    faults = multiprocessing.Array("l", 2)

    def collect(worker_id: int) -> None:
        faults[worker_id] = collection_page_faults()

    with fastload.DataLoader(clean, batch_size=4, num_workers=2, transform=T.val(16), worker_init_fn=collect) as loader:
        next(iter(loader))
    assert len(heap) and max(faults) < 1000, list(faults)


def test_a_sample_error_survives_pickling() -> None:
    """Errors cross process boundaries (multiprocessing, spawned workers) with where and why intact."""
    import pickle

    error = pickle.loads(pickle.dumps(SampleError("shard-00001.tar:cat/7", "cannot read image header")))
    assert (error.where, error.reason) == ("shard-00001.tar:cat/7", "cannot read image header")
    assert str(error) == "shard-00001.tar:cat/7: cannot read image header"

"""Worker processes that make whole batches straight into shared memory.

The batch slots (fastload.workers.slots) are mapped before the workers fork. A worker gets a part of
a batch (batch number, slot, first row, rows, their work), makes those rows of every column in
place as its :class:`WorkerJob` says, and answers with what does not travel in the slot. An image
loader's job (:class:`WorkerConfig`) decodes and transforms samples (pixels, masks, labels,
fixed-shape arrays in the slot; keys, skip records and the fields that travel as lists: text,
json, boxes, ragged arrays, parsed values, never shard bytes); a token loader's
(fastload.backends.cpu.token_epoch) reads and packs token rows. Workers live as long as the loader,
across epochs.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import queue
import signal
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, cast

import numpy as np

from fastload._util.processes import die_with_parent
from fastload.errors import FastloadError, SampleError, rebuild_error
from fastload.fields import SampleSpec
from fastload.storage.dataset import ShardedDataset
from fastload.transforms import Transform
from fastload.workers.batch_fill import fill_fields
from fastload.workers.slots import BatchBuffers
from fastload.workers.stage_clock import BUSY, StageClock, StageCounters

POLL_S = 0.2  # how often a waiting side checks that the other is still alive


class WorkerError(FastloadError):
    """A worker failed: it raised (traceback included) or died (signal or exit code named)."""


@dataclass
class BatchResult:
    """A worker's answer for rows ``start`` to ``start + count`` of a batch: where they are, their
    keys, skipped samples, or the error."""

    run: int  # the iteration that asked for it (answers for an abandoned one are recognised)
    batch_no: int
    slot: int
    count: int
    start: int = 0
    keys: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (where, reason)
    values: dict[str, list] = field(default_factory=dict)  # fields batched as lists (text, json, boxes, ...), by name
    error: str | None = None  # a worker traceback
    bad_sample: tuple[str, str] | None = None  # (where, reason) of the SampleError that stopped it
    failure: tuple[str, str] | None = None  # (class name, message) of another fastload error that stopped it


Filled = tuple[list[str], list[tuple[str, str]], dict[str, list]]  # a part's keys, skips and list-batched values


class WorkerJob(Protocol):
    """What a pool's workers do: fill rows of a batch slot from a task's work (an image batch's
    sample indices, a token batch's rows); inherited through fork, never pickled."""

    @property
    def buffers(self) -> BatchBuffers:
        """The batch slots the workers write into."""

    @property
    def worker_init_fn(self) -> Callable[[int], None] | None:
        """Run in each worker as it starts (torch's worker_init_fn)."""

    @property
    def counters(self) -> StageCounters:
        """The stage counters each worker times its stages into (its own row)."""

    def fill(self, columns: dict[str, np.ndarray], epoch: int, work: Any, clock: StageClock) -> Filled:
        """Make ``work`` into ``columns`` (the part's rows of the slot)."""

    def where(self, work: Any, row: int, key: str) -> str:
        """How an error names row ``row`` of a part made of ``work`` (``key``: what the part reported for it)."""

    def close(self) -> None:
        """Release what the worker opened (its shard files)."""


@dataclass(frozen=True)
class WorkerConfig:
    """An image loader's workers: decode and transform samples into the slot (fastload.workers.batch_fill)."""

    dataset: ShardedDataset
    transforms: tuple[Transform, ...]
    seed: int
    on_error: str
    skip_limit: int  # the most bad samples one search for a readable sample passes (fastload.workers.batch_fill.Substitutes)
    buffers: BatchBuffers
    worker_init_fn: Callable[[int], None] | None
    sample_spec: SampleSpec  # the fields to make of each sample
    counters: StageCounters  # each worker times its stages into its row

    def fill(self, columns: dict[str, np.ndarray], epoch: int, work: Any, clock: StageClock) -> Filled:
        """The samples ``work`` (indices) decoded and transformed into ``columns``."""
        return fill_fields(self.dataset, work, self.sample_spec, self.transforms, self.seed, epoch, self.on_error, columns, clock,
                           self.skip_limit)

    def where(self, work: Any, row: int, key: str) -> str:
        """The sample of ``key`` made for index ``work[row]``: it, or the readable one that stood in for it."""
        return _where_of(self.dataset, int(work[row]), key)

    def close(self) -> None:
        """Close this worker's shard files."""
        self.dataset.close()


def _worker_main(worker_id: int, config: WorkerJob, tasks: multiprocessing.Queue, results: multiprocessing.Queue, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    die_with_parent(parent)  # even while worker_init_fn or a batch is stuck
    # Objects inherited from the parent (torch, numpy, the index: ~40 MB) go to the permanent
    # generation: a collection here would otherwise write to every one of them, copying all
    # their pages (a fresh worker's first sample took ~100 ms and 11k page faults).
    gc.freeze()
    if config.worker_init_fn is not None:
        try:
            config.worker_init_fn(worker_id)
        except BaseException:  # reported to the training process, which raises it
            error = f"worker_init_fn raised in worker {worker_id} (pid {os.getpid()}):\n{traceback.format_exc()}"
            results.put(_dumps(BatchResult(run=0, batch_no=INIT_FAILED, slot=-1, count=0, error=error)))
            return
    clock = config.counters.clock(worker_id)
    while True:
        task = tasks.get()
        if task is None:
            break
        run, batch_no, slot, epoch, start, count, work = task
        result = BatchResult(run=run, batch_no=batch_no, slot=slot, count=count, start=start)
        began = time.perf_counter()
        try:
            columns = config.buffers.slot_columns(slot, slice(start, start + count))
            result.keys, result.skipped, result.values = config.fill(columns, epoch, work, clock)
        except SampleError as exc:
            result.bad_sample = (exc.where, exc.reason)
            result.error = f"worker {worker_id} (pid {os.getpid()}):\n{traceback.format_exc()}"
        except FastloadError as exc:  # a shard or a download that failed for good
            result.failure = (type(exc).__name__, str(exc))
            result.error = f"worker {worker_id} (pid {os.getpid()}):\n{traceback.format_exc()}"
        except Exception:
            result.error = f"worker {worker_id} (pid {os.getpid()}):\n{traceback.format_exc()}"
        clock.count(BUSY, time.perf_counter() - began)
        clock.flush()
        results.put(_packed(result, config, work, worker_id))
    config.close()


def _packed(result: BatchResult, job: WorkerJob, work: Any, worker_id: int) -> bytes:
    """``result`` pickled here, in the worker: a value that cannot travel (one ``map=`` returned,
    a structure too deep to pickle) makes it an error naming the sample. Left to the queue, the
    pickling would fail in its feeder thread, which only prints it: the batch would never come."""
    try:
        return _dumps(result)
    except Exception as exc:  # PicklingError, TypeError, RecursionError, ...: whatever the value raises
        failed = BatchResult(run=result.run, batch_no=result.batch_no, slot=result.slot, count=result.count, start=result.start)
        failed.bad_sample = _unsendable(result, job, work, exc)
        failed.error = f"worker {worker_id} (pid {os.getpid()}): {failed.bad_sample[1]}"
        return _dumps(failed)


def _dumps(result: BatchResult) -> bytes:
    return pickle.dumps(result, pickle.HIGHEST_PROTOCOL)


def _unsendable(result: BatchResult, job: WorkerJob, work: Any, exc: Exception) -> tuple[str, str]:
    """(where, reason) of the first sample whose value cannot be pickled back to the training process."""
    for name, values in result.values.items():
        for row, (key, value) in enumerate(zip(result.keys, values, strict=True)):
            try:
                pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
            except Exception as failure:
                reason = f"field {name}: its value cannot be sent from the worker ({type(failure).__name__}: {str(failure)[:80]})"
                return job.where(work, row, key), reason
    return f"batch {result.batch_no}", f"its result cannot be sent from the worker ({type(exc).__name__}: {str(exc)[:80]})"


def _where_of(ds: ShardedDataset, index: int, key: str) -> str:
    """How errors name the sample of ``key`` made for ``index``: it, or the readable one that stood in for it."""
    for offset in range(len(ds)):
        sample = ds.substitute(index, offset)
        if ds.key_of(sample) == key:
            return f"{ds.shard_name(ds.locate(sample)[0])}:{key}"
    return key


class WorkerPool:
    """``num_workers`` forked processes serving batch tasks; detects dead workers promptly."""

    def __init__(self, config: WorkerJob, num_workers: int) -> None:
        context = multiprocessing.get_context("fork")
        self._tasks: multiprocessing.Queue = context.Queue()
        self._results: multiprocessing.Queue = context.Queue()
        self.processes = [
            context.Process(
                target=_worker_main, args=(i, config, self._tasks, self._results, os.getpid()),
                name=f"fastload-worker-{i}", daemon=True,
            )
            for i in range(num_workers)
        ]
        for process in self.processes:
            process.start()
        self._next_check = 0.0  # when get() next checks that every worker is alive
        # runs at close(), when the pool is garbage, or at exit - only in the process that made it
        self._shutdown = weakref.finalize(self, _shutdown, os.getpid(), self.processes, self._tasks, self._results)

    def submit(self, run: int, batch_no: int, slot: int, epoch: int, start: int, count: int, work: Any) -> None:
        """Queue rows ``start`` to ``start + count`` of a batch (made of ``work``) of iteration ``run``
        for whichever worker is free first."""
        self._tasks.put((run, batch_no, slot, epoch, start, count, work))

    def get(self, timeout: float) -> BatchResult:
        """The next finished batch; raises WorkerError if a worker died, TimeoutError after
        ``timeout`` seconds (0 = wait forever)."""
        waited = 0.0
        while True:
            now = time.monotonic()
            if now >= self._next_check:  # a death is an error even if others cover its work (checked every POLL_S:
                self._next_check = now + POLL_S  # a check is a waitpid a worker, as dear as a small batch's hand-off)
                for process in self.processes:
                    if process.exitcode is not None:
                        raise WorkerError(self._death(process))
            try:
                result = pickle.loads(self._results.get(timeout=POLL_S))
            except queue.Empty:
                waited += POLL_S
            else:
                if result.batch_no == INIT_FAILED:
                    raise WorkerError(result.error)
                return result
            if timeout and waited >= timeout:
                raise TimeoutError(f"no batch from the workers within {timeout} s (timeout=)")

    def _death(self, process: multiprocessing.process.BaseProcess) -> str:
        """What to say of a dead worker: worker_init_fn's traceback when that is what ended it."""
        try:
            while True:
                result = pickle.loads(self._results.get(timeout=POLL_S))
                if result.batch_no == INIT_FAILED:
                    return result.error
        except queue.Empty:
            pass
        return f"{process.name} (pid {process.pid}) died: {_describe_exit(cast(int, process.exitcode))}"  # dead: it has an exit code

    def close(self) -> None:
        """Stop the workers: ask politely, then terminate, then kill."""
        self._shutdown()


INIT_FAILED = -1  # batch_no of the answer a worker sends when worker_init_fn raised


def _shutdown(owner: int, processes: list, tasks: multiprocessing.Queue, results: multiprocessing.Queue) -> None:
    if os.getpid() != owner:
        return  # a forked child (another loader's worker) inherited the pool: not its to stop
    try:
        while True:
            tasks.get_nowait()  # tasks no worker took yet (the next epoch's, made ahead): nobody waits for them
    except (queue.Empty, ValueError, OSError):
        pass
    for _ in processes:
        try:
            tasks.put_nowait(None)
        except (ValueError, OSError):
            break
    for process in processes:
        process.join(timeout=2)
        if process.exitcode is None:
            process.terminate()
            process.join(timeout=2)
        if process.exitcode is None:
            process.kill()
            process.join()
    for q in (tasks, results):
        q.cancel_join_thread()
        q.close()


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code}"


def raise_failure(result: BatchResult) -> NoReturn:
    """Raise here what stopped a worker's part: the SampleError or fastload error it raised (the
    worker's traceback as its cause), else a WorkerError holding that traceback."""
    if result.bad_sample is not None:
        raise SampleError(*result.bad_sample) from WorkerError(result.error)
    if result.failure is not None:
        raise rebuild_error(*result.failure) from WorkerError(result.error)
    raise WorkerError(result.error)


def merge_parts(parts: list[BatchResult]) -> BatchResult:
    """One batch's result from the results of its parts, in row order."""
    parts = sorted(parts, key=lambda part: part.start)
    merged = BatchResult(run=parts[0].run, batch_no=parts[0].batch_no, slot=parts[0].slot, count=sum(part.count for part in parts))
    for part in parts:
        merged.keys += part.keys
        merged.skipped += part.skipped
        for name, values in part.values.items():
            merged.values.setdefault(name, []).extend(values)
    return merged

"""Worker processes that decode and transform whole batches straight into shared memory.

The batch buffers are one anonymous shared mapping made before the workers fork: nothing is
named in /dev/shm, so nothing can leak, whatever kills the process tree. A worker gets a part of
a batch (batch number, slot, first row, sample indices), writes those rows of every stacked field
(pixels, masks, labels, fixed-shape arrays) in place, and answers with the keys, skip records and
the fields that travel as lists (text, json, boxes, ragged arrays: parsed values, never shard
bytes). Workers live as long as the loader, across epochs.
"""

from __future__ import annotations

import gc
import mmap
import multiprocessing
import os
import queue
import signal
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from fastload.dataset import ShardedDataset
from fastload.errors import FastloadError, SampleError
from fastload.fields import LABEL_FIELD, SampleSpec, classic_spec, image_field, parse_label
from fastload.sample_decode import PlannedSample, fill_sample, plan_image
from fastload.sampling import sample_rng
from fastload.transforms import Transform

POLL_S = 0.2  # how often a waiting side checks that the other is still alive
Attempted = TypeVar("Attempted")
MAX_SUBSTITUTES = 64  # with on_error="skip": how many following samples to try in place of a bad one


class WorkerError(FastloadError):
    """A worker failed: it raised (traceback included) or died (signal or exit code named)."""


def plan_sample(ds: ShardedDataset, index: int, specs: Sequence[Transform], seed: int, epoch: int) -> PlannedSample:
    """Read sample ``index`` and plan its transforms from the image header (nothing decoded yet)."""
    key, fields, pixels = ds.raw(index)
    where = f"{ds.index.shards[ds.locate(index)[0]].path}:{key}"
    label = parse_label(fields[LABEL_FIELD], where) if LABEL_FIELD in fields else -1
    if pixels is None:
        ext = image_field(fields)
        if ext is None:
            raise SampleError(where, f"no image field among {sorted(fields)}")
    return plan_image(key, where, label, pixels if pixels is not None else fields[ext], specs, sample_rng(seed, epoch, index))


def with_substitutes(
    ds: ShardedDataset, index: int, on_error: str, skipped: list[tuple[str, str]], attempt: Callable[[int], Attempted]
) -> Attempted:
    """``attempt(index)``, or with ``on_error="skip"`` ``attempt`` of the next sample in dataset
    order that does not raise SampleError (each one passed over is appended to ``skipped`` as
    (where, reason)), so a batch keeps its size whatever the number of workers."""
    for offset in range(MAX_SUBSTITUTES + 1):
        try:
            return attempt((index + offset) % len(ds))
        except SampleError as exc:
            if on_error == "raise":
                raise
            skipped.append((exc.where, exc.reason))
    raise SampleError(ds.where(index), f"it and the {MAX_SUBSTITUTES} samples after it are all unreadable")


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


def fill_fields(
    ds: ShardedDataset,
    indices: np.ndarray,
    spec: SampleSpec,
    specs: Sequence[Transform],
    seed: int,
    epoch: int,
    on_error: str,
    columns: dict[str, np.ndarray],
) -> tuple[list[str], list[tuple[str, str]], dict[str, list]]:
    """Write the batch's stacked fields into ``columns`` (field key -> its rows); return keys,
    skips and the other fields' values as lists. With ``on_error="skip"`` a bad sample is replaced
    by the next readable one (:func:`with_substitutes`)."""
    keys: list[str] = []
    skipped: list[tuple[str, str]] = []
    values: dict[str, list] = {f.key: [] for f in spec.fields if f.key not in columns}
    for j, index in enumerate(indices.tolist()):
        rows = {name: column[j, ...] for name, column in columns.items()}  # [j, ...]: a view even of a scalar row
        key, sample_values = with_substitutes(
            ds, index, on_error, skipped, lambda i: fill_sample(ds, i, spec, specs, seed, epoch, rows)  # noqa: B023 - called at once
        )
        keys.append(key)
        for name, value in sample_values.items():
            values[name].append(value)
    return keys, skipped, values


def fill_batch(
    ds: ShardedDataset,
    indices: np.ndarray,
    specs: Sequence[Transform],
    seed: int,
    epoch: int,
    on_error: str,
    images: np.ndarray,
    labels: np.ndarray,
) -> tuple[list[str], list[tuple[str, str]]]:
    """A classification batch: the samples' images into ``images`` (N,C,H,W), labels (-1 where
    none) into ``labels``; return keys and skips (:func:`fill_fields` of the classic spec)."""
    spec = classic_spec(ds.decoded)
    image, label = spec.fields
    keys, skipped, _ = fill_fields(ds, indices, spec, specs, seed, epoch, on_error, {image.key: images, label.key: labels})
    return keys, skipped


@dataclass(frozen=True)
class Column:
    """A stacked field's place in every batch slot: its name and one sample's shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def spec_columns(spec: SampleSpec, image_shape: tuple[int, int, int] | None) -> tuple[Column, ...]:
    """The slot columns of a SampleSpec: images (C, H, W) and masks (H, W) uint8 of the transforms'
    output size ``image_shape``, labels int64, arrays of their probed shape; in field order."""
    columns = []
    for f in spec.fields:
        if not spec.is_stacked(f):
            continue
        if f.role in ("image", "mask"):
            if image_shape is None:
                raise ValueError(f"field {f.name}: images vary in size; give a transform with a fixed output size")
            columns.append(Column(f.key, image_shape if f.role == "image" else image_shape[1:], "uint8"))
        elif f.role == "label":
            columns.append(Column(f.key, (), "int64"))
        else:
            shape, dtype = spec.layout_of(f.name)  # type: ignore[misc]
            columns.append(Column(f.key, shape, dtype))
    return tuple(columns)


class BatchBuffers:
    """``slots`` batch buffers in one anonymous shared mapping, each holding ``batch_size`` rows of
    every column (a stacked field: uint8 images, int64 labels, masks, arrays), and which slots are
    free, being filled, or lent to the caller.

    A finished batch's columns are *lent*: handed out as views of the slot, without a copy (a
    fresh 38 MB tensor per 256x224x224 batch cost ~40 ms of page faults, a tenth of the CPU), and
    the slot is free again when the last reference to those views dies. The caller may keep lent
    batches as long as it likes; to keep the workers busy, batches beyond ``slots - keep`` lent at
    once are copied instead.
    """

    def __init__(self, slots: int, batch_size: int, columns: Sequence[Column]) -> None:
        self.slots, self.batch_size, self.columns = slots, batch_size, tuple(columns)
        self._at: dict[str, tuple[int, Column]] = {}  # column name -> (byte offset in a slot, column)
        offset = 0
        for column in self.columns:
            self._at[column.name] = (offset, column)
            offset += batch_size * int(np.prod(column.shape, dtype=np.int64)) * np.dtype(column.dtype).itemsize
            offset += -offset % 64
        self._slot_bytes = max(offset, 64)
        try:
            self.memory = mmap.mmap(-1, slots * self._slot_bytes)  # MAP_SHARED | MAP_ANONYMOUS
        except (OSError, MemoryError) as exc:
            shapes = ", ".join(f"{c.name} {'x'.join(map(str, c.shape)) or 'scalar'} {c.dtype}" for c in self.columns)
            raise MemoryError(
                f"cannot allocate the loader's batch slots: {slots} slots of {self._slot_bytes:,} bytes "
                f"(batch_size={batch_size}, {shapes}) = {slots * self._slot_bytes:,} bytes "
                f"of shared memory ({exc.strerror or type(exc).__name__}); lower batch_size, num_workers or prefetch_factor"
            ) from None
        self._free = list(range(slots))
        self._lent: set[int] = set()
        self.filling: dict[int, int] = {}  # slot -> parts still being written by workers
        self._orphans: set[int] = set()  # filling slots whose batch nobody waits for any more

    def take(self) -> int | None:
        """A free slot to fill, or None when every slot is being filled or lent."""
        return self._free.pop() if self._free else None

    def give_back(self, slot: int) -> None:
        """Return a slot whose contents are no longer needed (again: no effect)."""
        if slot not in self._free:
            self._free.append(slot)

    def part_done(self, slot: int) -> None:
        """A worker finished writing one part of ``slot``; an orphaned slot is free once all are in."""
        left = self.filling[slot] - 1
        if left:
            self.filling[slot] = left
            return
        del self.filling[slot]
        if slot in self._orphans:
            self._orphans.discard(slot)
            self.give_back(slot)

    def release(self, slot: int) -> None:
        """Nobody needs this slot's batch: free now, or once the workers writing it are done."""
        if slot in self.filling:
            self._orphans.add(slot)
        else:
            self.give_back(slot)

    def forget_filling(self) -> None:
        """The workers are gone: nothing is being written any more."""
        self.filling.clear()
        self._orphans.clear()

    def reclaim(self) -> None:
        """At an epoch's start: every slot neither lent nor still being written is free."""
        self._free = [slot for slot in range(self.slots) if slot not in self._lent and slot not in self.filling]

    def lend(self, slot: int, count: int, keep: int) -> dict[str, np.ndarray] | None:
        """The first ``count`` rows of every column of ``slot`` as views that free the slot when
        the last of them dies, or None (the caller copies and gives the slot back) when lending
        would leave fewer than ``keep`` slots to fill."""
        if len(self._lent) + 1 > self.slots - keep:
            return None
        whole = np.frombuffer(self.memory, np.uint8, self._slot_bytes, slot * self._slot_bytes)
        self._lent.add(slot)
        weakref.finalize(whole, self._returned, slot)  # every column view keeps ``whole`` alive
        return {column.name: self._view(whole, column)[:count] for column in self.columns}

    def _returned(self, slot: int) -> None:
        self._lent.discard(slot)
        self._free.append(slot)

    def _view(self, whole: np.ndarray, column: Column) -> np.ndarray:
        offset, _ = self._at[column.name]
        size = self.batch_size * int(np.prod(column.shape, dtype=np.int64)) * np.dtype(column.dtype).itemsize
        return whole[offset : offset + size].view(column.dtype).reshape((self.batch_size, *column.shape))

    def column(self, slot: int, name: str) -> np.ndarray:
        """The (batch_size, *shape) view of column ``name`` in ``slot``."""
        return self._view(np.frombuffer(self.memory, np.uint8, self._slot_bytes, slot * self._slot_bytes), self._at[name][1])

    def slot_columns(self, slot: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
        """Every column of ``slot`` (those ``rows`` of it), by name."""
        whole = np.frombuffer(self.memory, np.uint8, self._slot_bytes, slot * self._slot_bytes)
        return {column.name: self._view(whole, column)[rows] for column in self.columns}

    def close(self) -> None:
        """Unmap (only once no view of it is alive)."""
        try:
            self.memory.close()
        except BufferError:
            pass  # a view is still referenced; the mapping goes with the last one


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker needs; inherited through fork, never pickled."""

    dataset: ShardedDataset
    specs: tuple[Transform, ...]
    seed: int
    on_error: str
    buffers: BatchBuffers
    worker_init_fn: Callable[[int], None] | None
    sample: SampleSpec  # the fields to make of each sample


def _worker_main(worker_id: int, config: WorkerConfig, tasks: multiprocessing.Queue, results: multiprocessing.Queue, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    # Objects inherited from the parent (torch, numpy, the index: ~40 MB) go to the permanent
    # generation: a collection here would otherwise write to every one of them, copying all
    # their pages (a fresh worker's first sample took ~100 ms and 11k page faults).
    gc.freeze()
    if config.worker_init_fn is not None:
        try:
            config.worker_init_fn(worker_id)
        except BaseException:  # noqa: BLE001 - reported to the training process, which raises it
            error = f"worker_init_fn raised in worker {worker_id} (pid {os.getpid()}):\n{traceback.format_exc()}"
            results.put(BatchResult(run=0, batch_no=INIT_FAILED, slot=-1, count=0, error=error))
            return
    while True:
        try:
            task = tasks.get(timeout=POLL_S * 5)
        except queue.Empty:
            if os.getppid() != parent:
                return  # the main process is gone
            continue
        if task is None:
            break
        run, batch_no, slot, epoch, start, indices = task
        result = BatchResult(run=run, batch_no=batch_no, slot=slot, count=len(indices), start=start)
        try:
            columns = config.buffers.slot_columns(slot, slice(start, start + len(indices)))
            result.keys, result.skipped, result.values = fill_fields(
                config.dataset, indices, config.sample, config.specs, config.seed, epoch, config.on_error, columns
            )
        except SampleError as exc:
            result.bad_sample = (exc.where, exc.reason)
            result.error = f"worker {worker_id} (pid {os.getpid()}):\n{traceback.format_exc()}"
        except FastloadError as exc:  # a shard or a download that failed for good
            result.failure = (type(exc).__name__, str(exc))
            result.error = f"worker {worker_id} (pid {os.getpid()}):\n{traceback.format_exc()}"
        except Exception:
            result.error = f"worker {worker_id} (pid {os.getpid()}):\n{traceback.format_exc()}"
        results.put(result)
    config.dataset.close()


class WorkerPool:
    """``num_workers`` forked processes serving batch tasks; detects dead workers promptly."""

    def __init__(self, config: WorkerConfig, num_workers: int) -> None:
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
        # runs at close(), when the pool is garbage, or at exit - only in the process that made it
        self._shutdown = weakref.finalize(self, _shutdown, os.getpid(), self.processes, self._tasks, self._results)

    def submit(self, run: int, batch_no: int, slot: int, epoch: int, start: int, indices: np.ndarray) -> None:
        """Queue rows ``start``.. of a batch (``indices``) of iteration ``run`` for whichever worker is free first."""
        self._tasks.put((run, batch_no, slot, epoch, start, indices))

    def get(self, timeout: float) -> BatchResult:
        """The next finished batch; raises WorkerError if a worker died, TimeoutError after
        ``timeout`` seconds (0 = wait forever)."""
        waited = 0.0
        while True:
            for process in self.processes:  # a death is an error even if others cover its work
                if process.exitcode is not None:
                    raise WorkerError(self._death(process))
            try:
                result = self._results.get(timeout=POLL_S)
            except queue.Empty:
                waited += POLL_S
            else:
                if result.batch_no == INIT_FAILED:
                    raise WorkerError(result.error)
                return result
            if timeout and waited >= timeout:
                raise TimeoutError(f"no batch from the workers within {timeout} s (timeout=)")

    def _death(self, process: multiprocessing.Process) -> str:
        """What to say of a dead worker: worker_init_fn's traceback when that is what ended it."""
        try:
            while True:
                result = self._results.get(timeout=POLL_S)
                if result.batch_no == INIT_FAILED:
                    return result.error  # type: ignore[return-value]
        except queue.Empty:
            pass
        return f"{process.name} (pid {process.pid}) died: {_describe_exit(process.exitcode)}"  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop the workers: ask politely, then terminate, then kill."""
        self._shutdown()


INIT_FAILED = -1  # batch_no of the answer a worker sends when worker_init_fn raised


def _shutdown(owner: int, processes: list, tasks: multiprocessing.Queue, results: multiprocessing.Queue) -> None:
    if os.getpid() != owner:
        return  # a forked child (another loader's worker) inherited the pool: not its to stop
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

"""Worker processes that decode and transform whole batches straight into shared memory.

The batch buffers are one anonymous shared mapping made before the workers fork: nothing is
named in /dev/shm, so nothing can leak, whatever kills the process tree. A worker gets a part of
a batch (batch number, slot, first row, sample indices), writes those rows' pixels and labels in
place, and answers with only the keys and skip records. Workers live as long as the loader,
across epochs.
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
from fastload.decode.cpu import decode_image
from fastload.decode.header import MAX_PIXELS, image_size
from fastload.errors import FastloadError, SampleError
from fastload.index import image_field, parse_label
from fastload.sampling import sample_rng
from fastload.transforms import Plan, Transform, apply_plan, dct_min_size, plan, scaled_box

try:
    from fastload.decode import _turbo
except ImportError:  # built without libjpeg headers: the simplejpeg/Pillow path does the work
    _turbo = None

POLL_S = 0.2  # how often a waiting side checks that the other is still alive
Attempted = TypeVar("Attempted")
MAX_SUBSTITUTES = 64  # with on_error="skip": how many following samples to try in place of a bad one


class WorkerError(FastloadError):
    """A worker failed: it raised (traceback included) or died (signal or exit code named)."""


@dataclass
class PlannedSample:
    """One sample read and planned: encoded bytes (or decoded pixels), its Plan, label and key."""

    key: str
    where: str
    label: int
    plan: Plan
    height: int
    width: int
    data: bytes | None = None
    pixels: np.ndarray | None = None


def plan_sample(ds: ShardedDataset, index: int, specs: Sequence[Transform], seed: int, epoch: int) -> PlannedSample:
    """Read sample ``index`` and plan its transforms from the image header (nothing decoded yet)."""
    key, fields, pixels = ds.raw(index)
    rng = sample_rng(seed, epoch, index)
    where = f"{ds.index.shards[ds.locate(index)[0]].path}:{key}"
    label = parse_label(fields["cls"], where) if "cls" in fields else -1
    if pixels is not None:
        height, width = pixels.shape[:2]
        return PlannedSample(key, where, label, plan(specs, height, width, rng), height, width, pixels=pixels)
    ext = image_field(fields)
    if ext is None:
        raise SampleError(where, f"no image field among {sorted(fields)}")
    data = fields[ext]
    width, height = image_size(data, where)  # a bomb or an empty image is a SampleError here
    return PlannedSample(key, where, label, plan(specs, height, width, rng), height, width, data=data)


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


def plan_with_substitutes(
    ds: ShardedDataset, index: int, specs: Sequence[Transform], seed: int, epoch: int, on_error: str, skipped: list[tuple[str, str]]
) -> PlannedSample:
    """:func:`plan_sample` of ``index`` or, with ``on_error="skip"``, of its substitute."""
    return with_substitutes(ds, index, on_error, skipped, lambda i: plan_sample(ds, i, specs, seed, epoch))


def transform_into(ds: ShardedDataset, index: int, specs: Sequence[Transform], seed: int, epoch: int, out: np.ndarray) -> tuple[int, str]:
    """Read, decode and transform sample ``index`` into ``out`` (C, H, W uint8); return (label or -1, key).

    JPEGs go through the libjpeg-turbo extension when it is built: only the crop's region is
    decoded, at the smallest sufficient DCT scale, and resampled straight into ``out``; other
    RGB pixels (PNG, decoded datasets) are resampled by the same extension, the rest by Pillow.
    """
    sample = plan_sample(ds, index, specs, seed, epoch)
    _check_size(sample.plan.size, out, sample.where)
    pixels = sample.pixels
    if sample.data is not None:
        data = sample.data
        if _turbo is not None and data[:3] == b"\xff\xd8\xff" and out.shape[0] == 3:
            try:
                _turbo.decode_crop_into(data, sample.plan.box, out, out.shape[1], out.shape[2], sample.plan.flip, MAX_PIXELS)
                return sample.label, sample.key
            except NotImplementedError:
                pass  # CMYK: the generic path below converts it
            except ValueError as exc:
                raise SampleError(sample.where, f"corrupt JPEG: {exc}") from None
            except MemoryError as exc:  # over the pixel limit by libjpeg's own reading of the header
                raise SampleError(sample.where, str(exc)) from None
        min_h, min_w = dct_min_size(sample.plan, sample.height, sample.width)
        pixels = decode_image(data, sample.where, min_h, min_w)
    if _turbo is not None and pixels.shape[2] == 3 == out.shape[0]:  # type: ignore[union-attr]
        height, width = pixels.shape[:2]  # type: ignore[union-attr]
        box = scaled_box(sample.plan, pixels, sample.height, sample.width)  # type: ignore[arg-type]
        pixels = np.ascontiguousarray(pixels)
        _turbo.resample_into(pixels, height, width, box, out, out.shape[1], out.shape[2], sample.plan.flip)
        return sample.label, sample.key
    result = apply_plan(pixels, sample.plan, sample.height, sample.width)  # type: ignore[arg-type]
    if result.shape[2] != out.shape[0]:
        raise SampleError(sample.where, f"has {result.shape[2]} channels, the batch holds {out.shape[0]}")
    np.copyto(out, result.transpose(2, 0, 1))
    return sample.label, sample.key


def _check_size(size: tuple[int, int], out: np.ndarray, where: str) -> None:
    if size != out.shape[1:]:
        raise SampleError(where, f"transforms give {size[0]}x{size[1]}, the batch holds {out.shape[1]}x{out.shape[2]}")


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
    error: str | None = None  # a worker traceback
    bad_sample: tuple[str, str] | None = None  # (where, reason) of the SampleError that stopped it
    failure: tuple[str, str] | None = None  # (class name, message) of another fastload error that stopped it


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
    """Write the batch's samples into ``images`` (N,C,H,W) and ``labels``; return keys and skips.

    With ``on_error="skip"`` a bad sample is replaced by the next readable one (:func:`with_substitutes`).
    """
    keys: list[str] = []
    skipped: list[tuple[str, str]] = []
    for j, index in enumerate(indices.tolist()):
        labels[j], key = with_substitutes(
            ds, index, on_error, skipped, lambda i: transform_into(ds, i, specs, seed, epoch, images[j])  # noqa: B023 - called at once
        )
        keys.append(key)
    return keys, skipped


class BatchBuffers:
    """``slots`` batch buffers (uint8 images and int64 labels) in one anonymous shared mapping,
    and which of them are free, being filled, or lent to the caller.

    A finished batch's images are *lent*: handed out as a view of the slot, without a copy (a
    fresh 38 MB tensor per 256x224x224 batch cost ~40 ms of page faults, a tenth of the CPU), and
    the slot is free again when the last reference to that view dies. The caller may keep lent
    batches as long as it likes; to keep the workers busy, batches beyond ``slots - keep`` lent at
    once are copied instead.
    """

    def __init__(self, slots: int, batch_size: int, image_shape: tuple[int, int, int]) -> None:
        self.slots, self.batch_size, self.image_shape = slots, batch_size, image_shape
        self._image_bytes = batch_size * int(np.prod(image_shape))
        self._slot_bytes = self._image_bytes + batch_size * 8
        self._slot_bytes += -self._slot_bytes % 64
        try:
            self.memory = mmap.mmap(-1, slots * self._slot_bytes)  # MAP_SHARED | MAP_ANONYMOUS
        except (OSError, MemoryError) as exc:
            raise MemoryError(
                f"cannot allocate the loader's batch slots: {slots} slots of {self._slot_bytes:,} bytes "
                f"(batch_size={batch_size}, images {'x'.join(map(str, image_shape))}) = {slots * self._slot_bytes:,} bytes "
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

    def lend(self, slot: int, count: int, keep: int) -> np.ndarray | None:
        """The first ``count`` images of ``slot`` as a view that frees the slot when it dies, or
        None (the caller copies and gives the slot back) when lending would leave fewer than
        ``keep`` slots to fill."""
        if len(self._lent) + 1 > self.slots - keep:
            return None
        view = self.images(slot)[:count]
        self._lent.add(slot)
        weakref.finalize(view, self._returned, slot)
        return view

    def _returned(self, slot: int) -> None:
        self._lent.discard(slot)
        self._free.append(slot)

    def images(self, slot: int) -> np.ndarray:
        """The (batch_size, C, H, W) uint8 view of a slot."""
        return np.frombuffer(self.memory, np.uint8, self._image_bytes, slot * self._slot_bytes).reshape(
            (self.batch_size, *self.image_shape)
        )

    def labels(self, slot: int) -> np.ndarray:
        """The (batch_size,) int64 label view of a slot."""
        return np.frombuffer(self.memory, np.int64, self.batch_size, slot * self._slot_bytes + self._image_bytes)

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
            rows = slice(start, start + len(indices))
            result.keys, result.skipped = fill_batch(
                config.dataset, indices, config.specs, config.seed, epoch, config.on_error,
                config.buffers.images(slot)[rows], config.buffers.labels(slot)[rows],
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
    return merged

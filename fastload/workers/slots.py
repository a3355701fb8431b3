"""The loader's batch slots: one anonymous shared mapping made before the workers fork (nothing is
named in /dev/shm, so nothing can leak, whatever kills the process tree), cut into slots of one
column per stacked field, and which slots are free, being filled, or lent to the caller."""

from __future__ import annotations

import mmap
import weakref
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from fastload.fields import SampleSpec
from fastload.media import MEDIA_ROLES


@dataclass(frozen=True)
class Column:
    """A stacked field's place in every batch slot: its name and one sample's shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def spec_columns(spec: SampleSpec, image_shape: tuple[int, int, int] | None) -> tuple[Column, ...]:
    """The slot columns of a SampleSpec: images (C, H, W) uint8 and masks (H, W) uint8 (uint16 for
    16-bit masks) of the transforms' output size ``image_shape``, labels int64, arrays of their
    probed shape, a media role's as its row of fastload.media says (a video's clips uint8, audio
    float32 and its lengths int64); in field order."""
    columns = []
    for f in spec.fields:
        if not spec.is_stacked(f):
            continue
        if f.role in ("image", "mask"):
            if image_shape is None:
                raise ValueError(f"field {f.name}: images vary in size; give a transform with a fixed output size")
            if f.role == "image":
                columns.append(Column(f.key, image_shape, "uint8"))
            else:
                columns.append(Column(f.key, image_shape[1:], "uint16" if f.name in spec.wide_masks else "uint8"))
        elif f.role in MEDIA_ROLES:
            media = MEDIA_ROLES[f.role]
            columns += [Column(*column) for column in media.columns(f.name, f.key, spec.media[f.role], image_shape)]
        elif f.role == "label":
            columns.append(Column(f.key, (), "int64"))
        else:
            shape, dtype = cast(tuple[tuple[int, ...], str], spec.shape_of(f.name))  # is_stacked: it has a shape
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
                f"of shared memory ({getattr(exc, 'strerror', None) or type(exc).__name__}); lower batch_size, num_workers or prefetch_factor"
            ) from None
        self._free = list(range(slots))
        self._lent: set[int] = set()
        self._filling: dict[int, int] = {}  # slot -> parts still being written by workers
        self._orphans: set[int] = set()  # filling slots whose batch nobody waits for any more

    def take(self) -> int | None:
        """A free slot to fill, or None when every slot is being filled or lent."""
        return self._free.pop() if self._free else None

    def give_back(self, slot: int) -> None:
        """Return a slot whose contents are no longer needed (again: no effect)."""
        if slot not in self._free:
            self._free.append(slot)

    def start_filling(self, slot: int, parts: int) -> None:
        """``slot`` (taken) is being written by ``parts`` worker tasks."""
        self._filling[slot] = parts

    def part_done(self, slot: int) -> None:
        """A worker finished writing one part of ``slot``; an orphaned slot is free once all are in."""
        left = self._filling[slot] - 1
        if left:
            self._filling[slot] = left
            return
        del self._filling[slot]
        if slot in self._orphans:
            self._orphans.discard(slot)
            self.give_back(slot)

    def release(self, slot: int) -> None:
        """Nobody needs this slot's batch: free now, or once the workers writing it are done."""
        if slot in self._filling:
            self._orphans.add(slot)
        else:
            self.give_back(slot)

    def forget_filling(self) -> None:
        """The workers are gone: nothing is being written any more."""
        self._filling.clear()
        self._orphans.clear()

    def reclaim(self, held: Collection[int] = ()) -> None:
        """At an epoch's start: every slot neither lent, nor still being written, nor ``held`` (the
        epoch's batches made ahead) is free."""
        self._free = [slot for slot in range(self.slots) if slot not in self._lent and slot not in self._filling and slot not in held]

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

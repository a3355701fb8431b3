"""What every shard layout's reader is (:class:`ShardReader`): random access to one sample's raw
fields by position. Each layout's reader (``formats/NAME/reader.py``) has this shape; it is opened
through :func:`fastload.formats.shard_files.open_shard`."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from fastload.formats.table import Facts


class ShardReader(Protocol):
    """Random access into one shard; opened lazily so it can be created before a fork."""

    def __len__(self) -> int:
        """Samples in the shard."""

    def key(self, i: int) -> str:
        """The key of sample ``i``."""

    def read(self, i: int, fields: Collection[str] | None = None) -> dict[str, bytes]:
        """Raw fields of sample ``i`` by extension (``jpg``, ``cls``, ...); only those named in
        ``fields`` when given (the others are not read)."""

    def open(self) -> None:
        """Open the shard file in this process now rather than at the first read."""

    def check(self) -> None:
        """Check the whole shard's structure against its index (for ``verify``); ShardError if not."""

    def close(self) -> None:
        """Release file handles."""

    def sample_table(self, facts: Sequence[Facts] = ()) -> bytes:
        """The shard's sample table (:mod:`fastload.formats.table`), built from its contents, with
        its videos' stream ``facts`` (read at conversion: none are probed here)."""

    def stream_facts(self, i: int) -> Facts:
        """The stream facts of sample ``i``'s videos, from the shard's sample table (empty: none)."""


class PixelReader(ShardReader, Protocol):
    """A reader of a shard holding decoded pixels (HDF5's ``pixels`` column)."""

    def pixels(self, i: int) -> np.ndarray:
        """Decoded HWC uint8 pixels of sample ``i``."""

"""Tar shards read by offset: the shard's sample table (or, where there is none, the DALI ``.idx``
beside it, parsed into memory) gives every member's position, so reading a sample is one
``pread`` per field, with no tar parsing."""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path

from fastload._util.files import close_when_dropped, open_in_root, read_file, this_process
from fastload.errors import DatasetIndexError, SampleError, ShardError
from fastload.fields import is_field_member
from fastload.formats.idx import TarMembers, parse_dali_index
from fastload.formats.table import Facts, SampleTable, encode_table, tar_labels
from fastload.formats.tar_headers import TarDamage, read_tar_members

MAX_GAP = 4096  # read a sample's fields in one pread when they are at most this far apart in all


class TarShardReader:
    """Random access to the samples of one tar shard, whose index entry says it holds ``samples``."""

    def __init__(
        self, path: str | Path, idx_path: str | Path | None, samples: int, table: SampleTable | None = None, root: str | None = None
    ) -> None:
        """Spans come from ``table`` when given (nothing per sample in memory), else from the
        ``.idx`` at ``idx_path``, parsed now (``check`` and ``sample_table`` read it too); the
        tar is opened as a file of the dataset under ``root`` (see :func:`open_in_root`)."""
        self.path = path
        self.root = root
        self.idx_path = idx_path
        self.samples = samples
        self._samples: SampleTable | TarMembers = table if table is not None else self.members()
        self._size = -1  # the file's size: every span read is checked against it
        self._fd: int | None = None
        self._pid = -1

    def members(self) -> TarMembers:
        """The shard's ``.idx``, parsed."""
        idx_path = self.idx_path
        if idx_path is None:
            raise ValueError(f"{self.path}: opened through its sample table, without its offset index")
        try:
            text = read_file(idx_path).decode()
        except OSError as exc:
            raise ShardError(f"{idx_path}: cannot read the shard's offset index ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise ShardError(f"{idx_path}: the shard's offset index is not UTF-8 text (at byte {exc.start})") from None
        try:
            members = parse_dali_index(text, str(idx_path))
        except DatasetIndexError as exc:
            raise ShardError(str(exc)) from None
        if len(members) != self.samples:
            raise ShardError(f"{idx_path}: lists {len(members)} samples, the index says {os.path.basename(self.path)} holds {self.samples}")
        return members

    def __len__(self) -> int:
        return len(self._samples)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fd"], state["_pid"], state["_closer"] = None, -1, None
        return state

    def _descriptor(self) -> int:
        if self._fd is None or self._pid != this_process():  # never share a descriptor across a fork
            try:
                fd, self._size, self.path = open_in_root(self.path, self.root)  # every open: a replaced shard's spans are checked against its own size
            except OSError as exc:
                raise ShardError(f"{self.path}: cannot open shard ({exc.strerror})") from None
            if isinstance(self._samples, SampleTable):
                self._samples.open()
            self._fd, self._pid, self._closer = fd, this_process(), close_when_dropped(self, fd)
        return self._fd

    def open(self) -> None:
        """Open the shard's descriptor in this process now."""
        self._descriptor()

    def key(self, i: int) -> str:
        """The key of sample ``i``."""
        return self._samples.key(i)

    def spans(self, i: int) -> dict[str, tuple[int, int]]:
        """Each field's (data offset, size) for sample ``i``."""
        return self._samples.spans(i)

    def read_head(self, i: int, ext: str, size: int) -> bytes:
        """The first ``size`` bytes of field ``ext`` of sample ``i`` (an image's header: one short ``pread``)."""
        fd = self._descriptor()
        offset, length = self._samples.spans(i)[ext]
        self._check_span(i, offset, length)
        return os.pread(fd, min(size, length), offset)

    def _check_span(self, i: int, offset: int, size: int) -> None:
        if offset < 0 or not 0 <= size <= self._size - offset:
            raise SampleError(f"{self.path}:{self.key(i)}", "its offset index entry gives a negative offset or size, or one past the end of the shard")

    def read(self, i: int, fields: Collection[str] | None = None) -> dict[str, bytes]:
        """The fields of sample ``i`` (those named in ``fields`` when given: the others are not
        read): one ``pread`` over all of them (a sample's members are neighbours in the tar, a
        tar header apart), else one per field."""
        fd = self._descriptor()
        spans = self._samples.spans(i)
        if not spans:  # every sample has a member: an index row without one was tampered with
            raise SampleError(f"{self.path}:{self.key(i)}", "its index entry lists no field")
        if fields is not None:
            spans = {ext: span for ext, span in spans.items() if ext in fields}
            if not spans:
                return {}
        for offset, size in spans.values():
            self._check_span(i, offset, size)
        start = min(offset for offset, _ in spans.values())
        end = max(offset + size for offset, size in spans.values())
        if end - start <= sum(size for _, size in spans.values()) + MAX_GAP:
            block = os.pread(fd, end - start, start)
            if len(block) == end - start:
                return {ext: block[offset - start : offset - start + size] for ext, (offset, size) in spans.items()}
        out = {}
        for ext, (offset, size) in spans.items():
            data = os.pread(fd, size, offset)
            if len(data) != size:
                raise ShardError(f"{self.path}: sample {self.key(i)!r} field {ext} is cut short (shard truncated?)")
            out[ext] = data
        return out

    def sample_table(self, facts: Sequence[Facts] = ()) -> bytes:
        """The shard's sample table, from its ``.idx`` (labels read from its ``cls`` members) and
        its videos' stream ``facts``."""
        members = self._samples if isinstance(self._samples, TarMembers) else self.members()
        keys = [members.key(i) for i in range(len(members))]
        spans = [members.spans(i) for i in range(len(members))]
        return encode_table(keys, spans, tar_labels(self.path, keys, spans), facts)

    def stream_facts(self, i: int) -> Facts:
        """The stream facts of sample ``i``'s videos: from the sample table (a shard read through its
        ``.idx`` alone has none)."""
        return self._samples.stream_facts(i) if isinstance(self._samples, SampleTable) else {}

    def check(self) -> None:
        """Walk the tar's member headers (:mod:`fastload.formats.tar_headers`) and check them against
        the ``.idx``: the same field members (others, such as a foreign tar's hidden or ``__*__``
        files, are no sample's) in the same order, at the same data offsets with the same sizes, all
        inside the file (a hard link at its target's)."""
        listed = self.members().members()
        try:
            found = [(name, offset, length) for _, name, offset, length in read_tar_members(self.path) if is_field_member(name)]
        except TarDamage as exc:
            if listed:
                raise ShardError(f"{self.path}: not a readable tar ({exc.reason}) though its .idx lists {len(listed)} members") from None
            found = []
        except OSError as exc:
            raise ShardError(f"{self.path}: cannot read it ({exc.strerror})") from None
        if len(found) != len(listed):
            raise ShardError(f"{self.path}: the tar holds {len(found)} members, its .idx lists {len(listed)}")
        for number, (member, want) in enumerate(zip(found, listed)):
            if member != want:
                raise ShardError(f"{self.path}: member {number} disagrees with the .idx (name, data offset or size)")

    def close(self) -> None:
        """Close the descriptor of this process."""
        if self._fd is not None and self._pid == this_process():
            self._closer()
        self._fd = None
        if isinstance(self._samples, SampleTable):
            self._samples.close()

"""A bounded local cache of remote shard files, shared by every worker and local rank on a machine.

Entries are named by their sha256 from the index (content-addressed: two datasets holding the same
shard share it). A file lock per entry makes concurrent users download it once; the download goes
to a temporary name and is checked against the index's size and sha256 before its rename. After
that check a stamp records the file's size and mtime, so later opens trust an unchanged file
without hashing it again and re-verify (and re-fetch) one that was modified. Least recently used
entries are evicted to stay under the size limit; a reader holding an evicted file open keeps
reading it (POSIX unlink semantics).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fastload._util.files import (
    TEMPORARY_MARK,
    atomic_write_bytes,
    check_relative_path,
    create_new,
    file_sha256,
    is_sha256,
    open_lock_file,
)
from fastload.errors import DatasetIndexError
from fastload.storage import remote

DEFAULT_CACHE_BYTES = 50 * 10**9
_STAMP = ".ok"
_LOCK = ".lock"
_RESERVED = ".reserved"


def default_cache_dir() -> Path:
    """FASTLOAD_CACHE_DIR, else $XDG_CACHE_HOME/fastload, else ~/.cache/fastload."""
    if os.environ.get("FASTLOAD_CACHE_DIR"):
        return Path(os.environ["FASTLOAD_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastload"


def default_cache_bytes() -> int:
    """FASTLOAD_CACHE_SIZE (e.g. "20GB"), else 50 GB."""
    from fastload._util.sizes import parse_size

    text = os.environ.get("FASTLOAD_CACHE_SIZE")
    return parse_size(text) if text else DEFAULT_CACHE_BYTES


@dataclass(frozen=True)
class RemoteFile:
    """One file of a remote dataset: where it is and what the index says it holds. ``name`` and
    ``sha256`` name its cache entry, so they are checked here too (as the index checks them).
    Its download is cut off past ``bytes``, or past ``max_bytes`` where the index gives no size."""

    url: str
    name: str  # the path relative to the dataset root, for the cache entry's name
    sha256: str | None
    bytes: int | None
    max_bytes: int = remote.MAX_UNSIZED_BYTES
    start: int | None = None  # a range of the file: its ``bytes`` from here (a Parquet row group read in place)
    version: str = ""  # what names the file's content where it has no sha256 (a Parquet file's footer's)

    def __post_init__(self) -> None:
        check_relative_path(self.name, f"{remote.redact(self.url)}: name")
        if self.sha256 is not None and not is_sha256(self.sha256):
            raise DatasetIndexError(f"{remote.redact(self.url)}: sha256 must be 64 lowercase hex digits")


class ShardCache:
    """Local copies of remote files under ``root``, at most ``max_bytes`` in all."""

    def __init__(self, root: str | os.PathLike[str] | None = None, max_bytes: int | None = None, storage_options: dict | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.max_bytes = max_bytes if max_bytes is not None else default_cache_bytes()
        if self.max_bytes < 1:
            raise ValueError("the cache size limit must be positive")
        self.storage_options = storage_options
        self.root.mkdir(parents=True, exist_ok=True)

    def entry(self, file: RemoteFile) -> Path:
        """The cache path of ``file``, directly under the cache root: by content hash (checked to be
        hex), or by a hash of its URL when the index has none; the suffix is of its checked name."""
        named = file.url if file.start is None else f"{file.url}#{file.start}+{file.bytes}@{file.version}"
        digest = file.sha256 or "url-" + hashlib.sha256(named.encode()).hexdigest()
        return self.root / f"{digest}{Path(file.name).suffix}"

    def path(self, file: RemoteFile) -> Path:
        """The verified local copy of ``file``, downloaded first when absent or modified. Open it
        soon: it is now the most recently used entry, so the last one eviction would take."""
        path = self.entry(file)
        while True:
            if not self._trusted(path, file):  # the common case, a verified hit, takes no lock
                with self._locked(path):
                    if not self._trusted(path, file):
                        self._download(file, path)
            try:
                os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))  # recency (atime) for LRU; mtime kept for the stamp
                return path
            except FileNotFoundError:
                continue  # another process evicted it since it was checked: fetch it again

    def _download(self, file: RemoteFile, path: Path) -> None:
        """Reserve room (under the cache-wide lock, so concurrent downloads of other entries
        count each other), then download without holding that lock."""
        reservation = path.with_name(f".{path.name}{_RESERVED}")
        with self._locked(self.root / "cache"):
            self._make_room(file.bytes or 0, keep=path)
            reservation.unlink(missing_ok=True)  # a killed download's: this entry's lock is ours
            fd = create_new(reservation)
            try:
                os.ftruncate(fd, file.bytes or 0)  # sparse: it only counts, it takes no disk
            finally:
                os.close(fd)
        try:
            remote.download(file.url, path, file.sha256, file.bytes, self.storage_options, file.max_bytes, file.start)
            with contextlib.suppress(FileNotFoundError):  # evicted at once by another process: path() fetches it again
                self._stamp(path)
        finally:
            reservation.unlink(missing_ok=True)

    def size(self) -> int:
        """Bytes held by cache entries now."""
        return sum(size for _, size, _ in self._entries())

    @contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        fd = open_lock_file(path.with_name(path.name + _LOCK))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _trusted(self, path: Path, file: RemoteFile) -> bool:
        """Whether ``path`` holds ``file`` verified: stamp matches, else re-hashed now."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return False
        if file.bytes is not None and st.st_size != file.bytes:
            return False
        stamp = path.with_name(path.name + _STAMP)
        try:
            if stamp.read_text() == _stamp_text(st):
                return True
        except FileNotFoundError:
            pass
        if file.sha256 is not None and file_sha256(path) != file.sha256:
            return False
        self._stamp(path)
        return True

    def _stamp(self, path: Path) -> None:
        atomic_write_bytes(path.with_name(path.name + _STAMP), _stamp_text(path.stat()).encode(), durable=False)

    def _entries(self) -> list[tuple[Path, int, float]]:
        """(path, size, last use) of every complete entry."""
        out = []
        for path in self.root.iterdir():
            if path.name.endswith((_STAMP, _LOCK)) or path.name.startswith("."):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):  # not the staging folder of conversions to a URL
                out.append((path, st.st_size, st.st_atime))
        return out

    def _reserved(self) -> int:
        """Bytes promised to downloads in progress. A reservation whose entry lock nobody holds
        was left by a process killed mid-download: it and that download's partial file are
        removed rather than counted (they would shrink the cache for good)."""
        total = 0
        for path in self.root.glob(f".*{_RESERVED}"):
            entry = self.root / path.name[1 : -len(_RESERVED)]
            if self._abandoned(entry):
                for leftover in (path, *self.root.glob(f".{entry.name}{TEMPORARY_MARK}*")):
                    leftover.unlink(missing_ok=True)
                continue
            try:
                total += path.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def _abandoned(self, entry: Path) -> bool:
        """Whether no process holds ``entry``'s lock (every download holds it throughout; flock
        locks go with their process, however it ends)."""
        try:
            fd = os.open(entry.with_name(entry.name + _LOCK), os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # closing drops a lock this call took
        return True

    def _make_room(self, incoming: int, keep: Path) -> None:
        """Evict least recently used entries until ``incoming`` more bytes fit under the limit."""
        entries = sorted(self._entries(), key=lambda e: e[2])
        total = sum(size for _, size, _ in entries) + self._reserved()
        for path, size, _ in entries:
            if total + incoming <= self.max_bytes:
                break
            if path == keep:
                continue
            for name in (path, path.with_name(path.name + _STAMP)):
                name.unlink(missing_ok=True)
            total -= size


def _stamp_text(st: os.stat_result) -> str:
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino}"

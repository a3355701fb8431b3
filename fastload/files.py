"""Dataset files handled safely: relative paths confined to the dataset root, regular files only
(a FIFO would block a reader), atomic and durable writes, sha256 digests."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from pathlib import Path

from fastload.errors import DatasetIndexError

_PATH_PART = re.compile(r"[A-Za-z0-9_.+=,@-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_relative_path(value: object, name: str) -> str:
    """``value`` if it is a path confined to the dataset root / URL prefix: '/'-separated parts of
    ASCII letters, digits and ``._+=,@-``, none empty, ``.`` or ``..`` (so no absolute path,
    backslash, NUL, ``%``, ``?`` or ``#`` either); else a DatasetIndexError naming field ``name``."""
    if not isinstance(value, str) or not all(
        part not in (".", "..") and _PATH_PART.fullmatch(part) for part in value.split("/")
    ):
        raise DatasetIndexError(
            f"{name}: must be a relative path inside the dataset ('/'-separated parts of letters, digits "
            "and ._+=,@-; no empty, '.' or '..' part)"
        )
    return value


def resolved_inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path | None:
    """``path`` with every symlink resolved, or None where that lies outside ``root`` (resolved
    too). Paths are compared part by part, never as strings: ``ds-private/x`` is not inside ``ds``."""
    real = Path(os.path.realpath(path))
    return real if real.is_relative_to(os.path.realpath(root)) else None


def is_sha256(value: object) -> bool:
    """Whether ``value`` is a sha256 hex digest as the writers record it (64 lowercase hex digits)."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of ``path``; an OSError unless it is a regular file (a FIFO would
    block the reader, a directory or device is no dataset file)."""
    return open_regular_sized(path)[0]


def open_regular_sized(path: str | os.PathLike[str], follow: bool = True) -> tuple[int, int]:
    """(descriptor, size in bytes) of the regular file ``path`` (see :func:`open_regular`): one
    ``open`` and one ``fstat``, which a reader's first open of a shard needs and no more;
    ``follow=False``: an OSError (ELOOP) where ``path`` itself is a symlink."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)  # O_NONBLOCK: opening a FIFO does not wait
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise OSError(errno.EISDIR if stat.S_ISDIR(info.st_mode) else errno.EINVAL, "not a regular file", str(path))
    return fd, info.st_size


def read_file(path: str | os.PathLike[str]) -> bytes:
    """The whole of a regular file (see :func:`open_regular`)."""
    with os.fdopen(open_regular(path), "rb") as f:
        return f.read()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one;
    ``durable`` also fsyncs file and folder (skip it for bookkeeping that may be lost in a crash)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a whole file, read in 4 MiB blocks."""
    sha = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as f:
        while block := f.read(1 << 22):
            sha.update(block)
    return sha.hexdigest()


def reserve_descriptors(count: int) -> None:
    """Grow this process's descriptor table at once to hold ``count`` more descriptors (at most
    its limit allows). The kernel grows the table by doubling, and each growth in a multi-threaded
    process (a loader worker is one) waits for an RCU grace period: 7-15 ms each measured here, so
    a worker opening 8,000 shard files paid ~70 ms in seven growths; reserved up front, one."""
    import fcntl
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    try:
        probe, other = os.pipe()  # a descriptor to copy that opens no file
    except OSError:
        return  # none to spare: opening the shard will say so
    try:
        target = probe + count if soft == resource.RLIM_INFINITY else min(probe + count, soft - 1)
        if target > other:
            os.close(fcntl.fcntl(probe, fcntl.F_DUPFD_CLOEXEC, target))  # the lowest free descriptor >= target: none is replaced
    except OSError:
        pass  # no free descriptor that high: the table grows as files open, as it would have
    finally:
        os.close(probe)
        os.close(other)

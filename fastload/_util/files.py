"""Dataset files handled safely: relative paths confined to the dataset root (the one check of where
links lead: :func:`resolved_inside`; a dataset's files opened through it: :func:`open_in_root`),
regular files only (a FIFO would block a reader), descriptors never shared across a fork, new files never created through a link (a dataset folder may hold
planted symlinks), atomic and durable writes, sha256 digests."""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import re
import secrets
import stat
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fastload.errors import DatasetIndexError, ShardError

_PATH_PART = re.compile(r"[A-Za-z0-9_.+=,@-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")


_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def this_process() -> int:
    """This process's id, kept by a fork hook: readers check it on every read (never share a
    descriptor across a fork), and ``os.getpid()`` is a system call (~7 a sample: ~2 us)."""
    return _pid


def close_when_dropped(owner: object, fd: int) -> weakref.finalize:
    """A finalizer that closes ``fd`` once and only in this process: when called (the owner's
    ``close()``) or when ``owner`` is garbage collected, so a reader dropped unclosed leaks no
    descriptor (a forked child, which opens its own, never closes the parent's)."""
    return weakref.finalize(owner, _close_in, fd, os.getpid())


def _close_in(fd: int, pid: int) -> None:
    if os.getpid() == pid:
        os.close(fd)


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


def inside_root(root: str, path: str) -> str:
    """``path`` once symlinks are followed, refused with a ShardError where that leaves ``root``."""
    real = resolved_inside(root, path)
    if real is None:
        raise ShardError(f"{path}: a symlink leads outside the dataset root; refusing to read it")
    return str(real)


def is_sha256(value: object) -> bool:
    """Whether ``value`` is a sha256 hex digest as the writers record it (64 lowercase hex digits)."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def open_in_root(path: str | Path, root: str | None) -> tuple[int, int, str | Path]:
    """(descriptor, size, the path opened) of a regular file: a file of a dataset under ``root``
    is opened without following a symlink at its end (two ``lstat`` calls fewer on a shard's
    first open), a link followed only where it stays inside ``root`` (then its resolved path
    comes back); with ``root`` None (a cache's file) as it is. OSError where it cannot be opened."""
    if root is None:
        return (*open_regular_sized(path), path)
    try:
        return (*open_regular_sized(path, follow=False), path)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    real = inside_root(root, str(path))
    return (*open_regular_sized(real), real)


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


def create_new(path: str | os.PathLike[str]) -> int:
    """A write descriptor of a new, empty file at ``path`` (``O_CREAT|O_EXCL|O_NOFOLLOW``): where
    anything already has that name, a symlink included, a FileExistsError, never a write through it."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)


TEMPORARY_MARK = ".tmp-"  # in every temporary's name: ``.NAME.tmp-RANDOM``


def temporary_beside(path: str | os.PathLike[str]) -> tuple[int, Path]:
    """(write descriptor, path) of a new file in ``path``'s folder, ``.NAME.tmp-RANDOM``, to write
    ``path`` under before a rename: created by :func:`create_new` under a name nobody can guess
    (a PID can be: a link planted at ``.NAME.tmp-PID`` was written through)."""
    path = Path(path)
    for _ in range(100):
        tmp = path.with_name(f".{path.name}{TEMPORARY_MARK}{secrets.token_hex(8)}")
        try:
            return create_new(tmp), tmp
        except FileExistsError:
            continue  # 64 random bits taken: only by something that lists the folder and races us
    raise FileExistsError(errno.EEXIST, "no free temporary name beside it", str(path))


def remove_temporaries(folder: Path, names: Iterable[str] | None = None) -> None:
    """Delete the temporaries (:func:`temporary_beside`) in ``folder`` of the files ``names`` (None:
    of any file) that a failed or killed writer left; call it only while no writer is live there
    (holding the folder's lock)."""
    patterns = [f".*{TEMPORARY_MARK}*"] if names is None else [f".{glob.escape(name)}{TEMPORARY_MARK}*" for name in names]
    for pattern in patterns:
        for stale in folder.glob(pattern):
            stale.unlink(missing_ok=True)


def open_lock_file(path: str | os.PathLike[str]) -> int:
    """A read-write descriptor of the lock file ``path`` (for ``flock``): created by
    :func:`create_new`, else the one there, opened without following a link and refused (OSError
    naming it) unless it is a regular file with no other hard link, so a lock never writes elsewhere."""
    while True:
        try:
            fd = create_new(path)
            os.close(fd)
        except FileExistsError:
            pass
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # removed by its holder between the two opens: create it again
        except OSError as exc:
            link = " (a symlink)" if exc.errno == errno.ELOOP else ""
            raise OSError(exc.errno, f"cannot use it as a lock file{link}: {exc.strerror}", str(path)) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(fd)
            raise OSError(errno.EINVAL, "cannot use it as a lock file (not a regular file, or hard-linked elsewhere)", str(path))
        return fd


@contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """Re-raise an OSError that names no file (a failed write: ENOSPC, EFBIG) as one naming ``path``."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, durable: bool = True, sync_folder: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one (a
    :func:`temporary_beside` renamed over it, removed if the write fails: an error then names
    ``path``); ``durable`` also fsyncs the file and, unless ``sync_folder`` is False (a caller
    syncing it once for many files), the folder (skip it for bookkeeping that may be lost in a crash)."""
    path = Path(path)
    fd, tmp = temporary_beside(path)
    try:
        with naming(path), os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable and sync_folder:
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

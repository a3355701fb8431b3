"""One conversion (or ``fastload index``) at a time per output folder: an exclusive ``flock`` on
``OUT/.fastload-lock``, held for the whole run (the kernel drops it when the process dies, however
it dies). A second run fails at once, naming the first one's pid, rather than waiting: the two
would have been given the same OUT by mistake, and a wait would hide that. The lock file is never written through a link
(:func:`fastload._util.files.open_lock_file`): a ``.fastload-lock`` symlink planted in OUT is refused."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fastload._util.files import open_lock_file

LOCK_FILE = ".fastload-lock"


class OutputLocked(RuntimeError):
    """Another conversion (or ``fastload index``) is writing to the same output folder."""


@contextmanager
def locked_output(out: Path) -> Iterator[None]:
    """Hold the lock on ``out`` (a folder that exists) while the body runs; the lock file is
    removed when the body ends, succeeding or failing (still held then: a run that opened it
    meanwhile finds it gone and takes a new one), so OUT holds only a dataset's own files and
    the bookkeeping a rerun resumes from."""
    path = out / LOCK_FILE
    while True:
        fd = open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 16, 0).strip()
            os.close(fd)
            pid = holder.decode() if holder.isdigit() else "unknown"
            raise OutputLocked(f"{out} is being written by another fastload convert or index (pid {pid}); wait for it to finish or choose another OUT") from None
        try:
            if os.fstat(fd).st_ino == os.lstat(path).st_ino:
                break  # the file is still the one at that name: the lock is ours
        except FileNotFoundError:
            pass  # the previous holder removed it after we opened it: take the new one
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        try:
            path.unlink()
        finally:
            os.close(fd)

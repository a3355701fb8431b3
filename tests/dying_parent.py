"""The parent that tests/test_processes.py kills: it starts a real forked pool whose children each
leave a file named by their pid in ``pid_dir`` and then block for good (a stuck worker_init_fn, a
stuck conversion task), and waits; the test SIGKILLs it and watches the children.

    python tests/dying_parent.py loader DATASET PID_DIR    a DataLoader's two workers
    python tests/dying_parent.py converter PID_DIR         a conversion engine's two workers
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path


def stuck(pid_dir: str, *_: object) -> None:
    """Leave this process's pid in ``pid_dir`` and block until killed."""
    Path(pid_dir, str(os.getpid())).touch()
    threading.Event().wait()


def main() -> None:
    """Start the pool named by argv[1]; never returns."""
    if sys.argv[1] == "loader":
        import functools

        import fastload
        import fastload.transforms as T

        loader = fastload.DataLoader(sys.argv[2], batch_size=2, num_workers=2, transform=T.val(16),
                                     worker_init_fn=functools.partial(stuck, sys.argv[3]))
        next(iter(loader))  # the workers never answer: this waits until the test kills the process
    else:
        from fastload.converters.engines.local import LocalEngine

        list(LocalEngine(2).map_unordered(stuck, [sys.argv[2]] * 2))
    raise AssertionError("the pool's stuck children answered")


if __name__ == "__main__":
    main()

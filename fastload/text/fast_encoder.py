"""fastokens, an exact and faster encoder of a ``tokenizer.json``: the only module importing it.
It gives the ids ``tokenizers`` gives (checked on a sample of each corpus before a conversion
uses it: ``fastload.text.tokenizer.with_fast_encoder``) and refuses what it cannot encode
exactly (an NFKC normalizer, for one) when it loads the file."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

EXTRA = "fast-tokenizer"  # the extra that installs it: pip install 'fastload[fast-tokenizer]'
THREADS = "FASTOKENS_BPE_THREADS"  # the threads it encodes a batch with, read once a process (at its first batch)


def import_fastokens() -> Any:
    """The fastokens module, or an ImportError naming the extra that installs it."""
    try:
        import fastokens
    except ImportError:
        raise ImportError(f"fastokens is not installed: pip install 'fastload[{EXTRA}]'") from None
    return fastokens


def share_cores(processes: int) -> None:
    """Have fastokens encode on this process's share of the cores, where ``processes`` processes
    forked from it encode at once: ``THREADS`` set to the cores over ``processes`` (at least 1),
    unless the environment sets it. Called before this process encodes (the variable is read once a
    process), so one thread each leaves no pool thread of fastokens' alive when the workers fork."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault(THREADS, str(max(1, cores // processes)))


def one_thread() -> None:
    """Have fastokens encode in the calling thread alone (``THREADS`` 1, unless the environment sets it): no pool
    thread of its own is alive in a process that forks later. Called before this process first encodes."""
    os.environ.setdefault(THREADS, "1")


def version() -> str:
    """The library and its version, as an index records what made the ids."""
    import_fastokens()
    return f"fastokens {metadata.version('fastokens')}"


def load_tokenizer_json(path: Path) -> Any:
    """The ``fastokens.Tokenizer`` of the file ``path``; a ValueError naming it where fastokens
    cannot read or encode it (its message says what, e.g. an unsupported normalizer)."""
    fastokens = import_fastokens()
    try:
        return fastokens.Tokenizer.from_file(str(path))
    except Exception as exc:  # a ValueError for a part it does not support; other errors for a file it cannot parse
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ValueError(f"{path}: fastokens cannot encode it ({reason})") from None


def token_id(tokenizer: Any, text: str) -> int | None:
    """The id fastokens gives the token ``text`` (None: none)."""
    found = tokenizer.token_to_id(text)
    return None if found is None else int(found)


def encode_arrays(tokenizer: Any, texts: list[str], allow_special: bool) -> tuple[np.ndarray, np.ndarray]:
    """The texts' ids back to back (uint32, as fastokens gives them: no copy) and each text's count
    (int64), no special tokens added; a special token's text encoded as ordinary text unless ``allow_special``."""
    ids, offsets = tokenizer.encode_batch_flat(texts, add_special_tokens=False, split_special_tokens=not allow_special)
    return np.frombuffer(ids, dtype="<u4"), np.diff(np.frombuffer(offsets, dtype="<u8")).astype(np.int64)

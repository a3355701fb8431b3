"""Object storage through fsspec (s3://, gs://, http(s)://, any fsspec URL): whole-file download
with checksum, upload, small reads and writes, each retried with backoff on transient failures.
Every read is bounded: a file by the size the index declares, anything else (index.json, reports)
by :data:`MAX_UNSIZED_BYTES`; a server sending more is cut off (an endless body once filled the
cache's disk) with a RemoteError naming the URL.

The only module importing fsspec. Credentials come only from each filesystem's own mechanisms
(environment, config files) or ``storage_options``; they are never logged, and URLs in messages
have any ``user:password@`` part removed.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from fastload._util.files import temporary_beside
from fastload.errors import RemoteError

T = TypeVar("T")
CHUNK = 4 << 20
MAX_UNSIZED_BYTES = 64 << 20  # an object no index sizes (index.json, a report): ~200,000 shards' index entries
# 4xx answers that may succeed when asked again: timeout, too many requests
_RETRYABLE_STATUS = {408, 425, 429}
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, ValueError, TypeError, NotImplementedError)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently transient failures are retried (env: FASTLOAD_RETRIES,
    FASTLOAD_RETRY_DELAY seconds before the first retry, FASTLOAD_IO_TIMEOUT seconds of silence)."""

    attempts: int = 6
    first_delay: float = 0.5
    max_delay: float = 15.0
    io_timeout: float = 60.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The policy with any environment overrides applied."""
        return cls(
            attempts=max(1, int(os.environ.get("FASTLOAD_RETRIES", cls.attempts))),
            first_delay=float(os.environ.get("FASTLOAD_RETRY_DELAY", cls.first_delay)),
            io_timeout=float(os.environ.get("FASTLOAD_IO_TIMEOUT", cls.io_timeout)),
        )

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based): exponential, jittered."""
        return min(self.max_delay, self.first_delay * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


def is_url(path: object) -> bool:
    """Whether ``path`` names remote storage (``scheme://...``, other than ``file://``)."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def redact(url: str) -> str:
    """``url`` without its credentials (``user:password@``, or a token alone: ``TOKEN@``), for
    messages; the host is kept as written (an IPv6 address keeps its brackets)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def join(url: str, *names: str) -> str:
    """``url`` with path parts appended, one slash between each."""
    return "/".join([url.rstrip("/"), *(n.strip("/") for n in names)])


def answered_status(exc: BaseException) -> int | None:
    """The HTTP error status (4xx, 5xx) a server answered, where ``exc`` carries one (``status`` or
    ``code``) or an exception it was raised from does (a response's ``status``: fsspec's HTTP lookups
    raise FileNotFoundError from any failure; a ``code`` deeper down may be the client's own parse error's)."""
    seen: BaseException | None = exc
    for depth in range(8):  # a chain is short; a cycle ends here
        if seen is None:
            break
        status = getattr(seen, "status", None) or (getattr(seen, "code", None) if depth == 0 else None)
        if isinstance(status, int) and 400 <= status < 600:
            return status
        seen = seen.__cause__ or seen.__context__
    return None


def is_absent(exc: BaseException) -> bool:
    """Whether ``exc`` says the object does not exist: a 404, or a FileNotFoundError no other answer lies behind."""
    status = answered_status(exc)
    return status == 404 or (isinstance(exc, FileNotFoundError) and status is None)


def is_transient(exc: BaseException) -> bool:
    """Whether a failure may go away when tried again: timeouts, resets, 5xx, throttling."""
    status = answered_status(exc)
    if status is not None:
        return status >= 500 or status in _RETRYABLE_STATUS
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, (OSError, TimeoutError, ConnectionError, EOFError)):
        return True
    module = type(exc).__module__
    return module.startswith(("aiohttp", "botocore", "aiobotocore", "urllib3", "requests", "google", "asyncio"))


_filesystems: dict[tuple, Any] = {}


def filesystem(url: str, storage_options: dict | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) for ``url``; one instance per process and options."""
    try:
        import fsspec
        from fsspec.core import split_protocol
    except ImportError:
        raise ImportError(f"reading {redact(url)} needs fsspec: pip install 'fastload[cloud]'") from None
    protocol = split_protocol(url)[0] or "file"
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        raise ImportError(f"{redact(url)}: no filesystem for {protocol}:// ({exc}); pip install 'fastload[cloud]'") from None
    # what the URL itself says (ftp://user:password@host:port/...: the host, port and login), as fsspec.url_to_fs takes it
    options = {**cls._get_kwargs_from_urls(url), **(storage_options or {})}
    if protocol in ("http", "https"):
        options.setdefault("client_kwargs", {}).setdefault("timeout", _http_timeout())
    key = (os.getpid(), protocol, repr(sorted(options.items())))
    fs = _filesystems.get(key)
    if fs is None:
        fs = _filesystems[key] = retrying(f"open its {protocol}:// filesystem", url, lambda: cls(skip_instance_cache=True, **options))  # ftp:// connects here
    return fs, fs._strip_protocol(url) if protocol not in ("http", "https") else url


def _http_timeout():
    import aiohttp

    seconds = RetryPolicy.from_env().io_timeout
    return aiohttp.ClientTimeout(total=None, sock_connect=seconds, sock_read=seconds)


def retrying(what: str, url: str, fn: Callable[[], T], policy: RetryPolicy | None = None) -> T:
    """Run ``fn``; retry transient failures with backoff; raise :class:`RemoteError` naming the URL."""
    policy = policy or RetryPolicy.from_env()
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except RemoteError:
            raise  # already says what went wrong with which URL, and asking again would not change it
        except Exception as exc:  # classified below
            if is_absent(exc):
                raise RemoteError(f"{redact(url)}: not found (while trying to {what})") from None
            if not is_transient(exc) or attempt == policy.attempts:
                tries = f" after {attempt} attempts" if attempt > 1 else ""
                status = answered_status(exc)
                why = f"the server answered {status} ({_phrase(status)})" if status is not None else f"{type(exc).__name__}: {exc}"
                raise RemoteError(f"{redact(url)}: cannot {what}{tries}: {why}") from exc
            time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")


def _phrase(status: int) -> str:
    """The standard reason phrase of an HTTP status ("Forbidden"), or "unknown status"."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "unknown status"


def read_bytes(url: str, storage_options: dict | None = None, max_bytes: int = MAX_UNSIZED_BYTES) -> bytes:
    """The whole (small) object at ``url``, at most ``max_bytes`` (a RemoteError past it)."""
    fs, path = filesystem(url, storage_options)
    return retrying("read it", url, lambda: _read_bounded(fs, path, url, max_bytes))


def read_if_exists(url: str, storage_options: dict | None = None, max_bytes: int = MAX_UNSIZED_BYTES) -> bytes | None:
    """The whole (small) object at ``url``, at most ``max_bytes``, or None when there is none."""
    fs, path = filesystem(url, storage_options)

    def cat() -> bytes | None:
        try:
            return _read_bounded(fs, path, url, max_bytes)
        except FileNotFoundError as exc:
            if not is_absent(exc):
                raise
            return None

    return retrying("read it", url, cat)


def _stream(fs: Any, path: str, url: str, size: int | None, start: int | None = None) -> Any:
    """``path`` opened for one pass from its start: over HTTP(S) a plain streamed GET (``size``
    known or not), elsewhere the filesystem's own file; with ``start``, its ``size`` bytes from
    there, read by range requests."""
    if start is not None:
        return _Range(fs, path, start, size or 0)
    kwargs: dict[str, Any] = {"block_size": 0, "size": size} if url.startswith(("http://", "https://")) else {}
    return fs.open(path, "rb", **kwargs)


def _blocks(src: Any, url: str, limit: int) -> Iterator[bytes]:
    """The blocks read from ``src`` to its end; a RemoteError naming ``url`` once they pass ``limit``
    bytes (read at most one byte past it)."""
    got = 0
    while block := src.read(min(CHUNK, limit + 1 - got)):
        got += len(block)
        if got > limit:
            raise RemoteError(f"{redact(url)}: the server sent more than {limit} bytes, the most expected of it; download stopped")
        yield block


def _read_bounded(fs: Any, path: str, url: str, limit: int) -> bytes:
    with _stream(fs, path, url, None) as src:
        return b"".join(_blocks(src, url, limit))


def size(url: str, storage_options: dict | None = None) -> int | None:
    """Size in bytes of the object at ``url``, or None when there is none."""
    fs, path = filesystem(url, storage_options)

    def info() -> int | None:
        try:
            return int(fs.info(path)["size"])
        except FileNotFoundError as exc:
            if not is_absent(exc):
                raise
            return None

    return retrying("look it up", url, info)


def list_sizes(url: str, suffix: str, storage_options: dict | None = None) -> dict[str, int]:
    """Size in bytes of each object directly under ``url`` (a folder or prefix) whose name ends in
    ``suffix``, by name, sorted (a listing that gives no size: the object is looked up)."""
    fs, path = filesystem(url, storage_options)

    def ls() -> dict[str, int]:
        found = {}
        for entry in fs.ls(path, detail=True):
            name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
            if name.endswith(suffix) and entry.get("type", "file") != "directory":
                found[name] = entry.get("size")
        return {name: int(size) if size is not None else int(fs.info(join(path, name))["size"]) for name, size in sorted(found.items())}

    return retrying("list it", url, ls)


def find_sizes(url: str, suffix: str, storage_options: dict | None = None) -> dict[str, int]:
    """Size in bytes of each object anywhere under ``url`` whose name ends in ``suffix``, by its path
    relative to ``url``, sorted (``hf://datasets/ORG/NAME``: the repository's files)."""
    fs, path = filesystem(url, storage_options)
    base = path.rstrip("/") + "/"

    def find() -> dict[str, int]:
        found = fs.find(path, detail=True)
        return {name[len(base):]: int(entry["size"]) for name, entry in sorted(found.items())
                if name.endswith(suffix) and name.startswith(base) and entry.get("type", "file") != "directory"}

    return retrying("list it", url, find)


def glob_sizes(pattern: str, storage_options: dict | None = None) -> dict[str, int]:
    """Size in bytes of each object matching ``pattern`` (``s3://bucket/data/*.parquet``), by its
    path relative to the pattern's fixed part (the folder before the first wildcard), sorted."""
    fs, path = filesystem(pattern, storage_options)
    fixed = path[: min(path.index(c) for c in "*?[" if c in path)].rsplit("/", 1)[0] + "/"

    def glob() -> dict[str, int]:
        found = fs.glob(path, detail=True)
        return {name[len(fixed):]: int(entry["size"]) for name, entry in sorted(found.items())
                if name.startswith(fixed) and entry.get("type", "file") != "directory"}

    return retrying("list it", pattern, glob)


def read_range(url: str, start: int, length: int, storage_options: dict | None = None) -> bytes:
    """``length`` bytes of the object at ``url`` from byte ``start`` (one range request; a server
    answering with more or fewer is a RemoteError naming the URL)."""
    fs, path = filesystem(url, storage_options)

    def read() -> bytes:
        with _Range(fs, path, start, length) as src:
            data = b"".join(_blocks(src, url, length))
        if len(data) != length:
            raise _Mismatch(f"got {len(data)} bytes of the {length} asked for from byte {start}")
        return data

    return retrying(f"read bytes {start}-{start + length}", url, read)


def remove(url: str, storage_options: dict | None = None) -> None:
    """Delete the object at ``url``; absent is fine."""
    fs, path = filesystem(url, storage_options)

    def rm() -> None:
        try:
            fs.rm_file(path)
        except FileNotFoundError as exc:
            if not is_absent(exc):
                raise
            pass

    retrying("delete it", url, rm)


def upload(local: str | os.PathLike[str], url: str, storage_options: dict | None = None) -> None:
    """Copy a local file to ``url`` (one atomic PUT on object stores)."""
    fs, path = filesystem(url, storage_options)
    retrying("upload it", url, lambda: fs.put_file(str(local), path))


def download(
    url: str, dest: Path, sha256: str | None, expected_bytes: int | None, storage_options: dict | None = None,
    max_bytes: int = MAX_UNSIZED_BYTES, start: int | None = None,
) -> None:
    """Stream ``url`` into ``dest`` (via a temporary name beside it), checking size and sha256 when
    given; the file may hold ``expected_bytes``, else at most ``max_bytes``. With ``start``: the
    ``expected_bytes`` from byte ``start`` on, read by ranges of at most CHUNK bytes (a Parquet
    row group of a file read in place, never the whole file).

    A transfer cut short or a checksum mismatch is retried like any transient failure (a fresh
    download each time); one that still mismatches after the last attempt raises, naming the URL.
    A server sending more than the bound is cut off at once, the partial file removed (not
    retried: an endless body would only be fetched again).
    """
    fs, path = filesystem(url, storage_options)
    limit = expected_bytes if expected_bytes is not None else max_bytes

    def fetch() -> None:
        digest = hashlib.sha256()
        got = 0
        fd, tmp = temporary_beside(dest)
        try:
            with os.fdopen(fd, "wb") as out, _stream(fs, path, url, expected_bytes or None, start) as src:
                for block in _blocks(src, url, limit):
                    digest.update(block)
                    out.write(block)
                    got += len(block)
            if expected_bytes is not None and got != expected_bytes:
                raise _Mismatch(f"got {got} bytes, the index says {expected_bytes} (transfer cut short?)")
            if sha256 is not None and digest.hexdigest() != sha256:
                raise _Mismatch(f"sha256 {digest.hexdigest()[:12]}... differs from the index's {sha256[:12]}...")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    retrying("download it", url, fetch)


class _Range:
    """``length`` bytes of ``path`` from ``start``, read by range requests of at most CHUNK bytes:
    the file-like ``_blocks`` reads (``read(n)``; a context manager)."""

    def __init__(self, fs: Any, path: str, start: int, length: int) -> None:
        self._file = fs.open(path, "rb", block_size=max(1, min(length, CHUNK)), cache_type="none")
        self._at, self._end = start, start + length
        self._file.seek(start)

    def read(self, size: int) -> bytes:
        data = self._file.read(min(size, self._end - self._at)) if self._at < self._end else b""
        self._at += len(data)
        return data

    def __enter__(self) -> _Range:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()


class _Mismatch(ConnectionError):
    """The downloaded bytes are not the ones the index describes (retried as transient)."""

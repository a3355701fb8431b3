"""The shard cache against a real HTTP server on loopback (tests/storage/test_remote.py's, which counts
requests): a verified entry is served without a download, a modified or truncated one is fetched
again, the least recently used entries go first and an exact fit evicts nothing, downloads in
progress count against the limit, and only entries count towards its size."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fastload.storage.cache import RemoteFile, ShardCache, default_cache_bytes, default_cache_dir
from tests.storage.test_remote import DatasetServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[DatasetServer]:
    """Serves tmp_path/served: files a, b, c, d (.tar) of 1000 random bytes each and e of 2000."""
    root = tmp_path / "served"
    root.mkdir()
    rng = np.random.default_rng(0)
    for name, size in (("a", 1000), ("b", 1000), ("c", 1000), ("d", 1000), ("e", 2000)):
        (root / f"{name}.tar").write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    served = DatasetServer(root)
    served.slow_seconds = 1.0
    served.directory = root  # type: ignore[attr-defined]
    yield served
    served.shutdown()
    served.server_close()


def remote(server: DatasetServer, name: str, checksum: bool = True) -> RemoteFile:
    """The RemoteFile of served NAME.tar, with its size and (unless ``checksum`` is False) sha256."""
    data = (server.directory / f"{name}.tar").read_bytes()  # type: ignore[attr-defined]
    return RemoteFile(f"{server.url}{name}.tar", f"{name}.tar", hashlib.sha256(data).hexdigest() if checksum else None, len(data))


def cached(cache: ShardCache, server: DatasetServer) -> set[str]:
    """The names of the served files that have an entry in the cache now."""
    return {name for name in "abcde" if cache.entry(remote(server, name)).exists()}


def test_a_verified_entry_is_served_without_downloading_again(server: DatasetServer, tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", max_bytes=10**6)
    a = remote(server, "a")
    first = cache.path(a)
    assert first == cache.entry(a) and first.read_bytes() == (tmp_path / "served" / "a.tar").read_bytes()
    assert cache.path(a) == first and server.counts["a.tar"] == 1
    assert ShardCache(tmp_path / "cache", max_bytes=10**6).path(a) == first and server.counts["a.tar"] == 1  # another process's cache object


def test_an_entry_evicted_by_another_process_after_its_check_is_fetched_again(
    server: DatasetServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's eviction can land between this one's check of a hit and its use of
    it: the entry is downloaded again rather than a FileNotFoundError reaching the reader."""
    cache = ShardCache(tmp_path / "cache", max_bytes=10**6)
    a = remote(server, "a")
    cache.path(a)
    check, evictions = cache._trusted, [1]

    def evicted_right_after_the_check(path: Path, file: RemoteFile) -> bool:
        trusted = check(path, file)
        if trusted and evictions:  # as another process's _make_room would, once
            path.unlink()
            evictions.pop()
        return trusted

    monkeypatch.setattr(cache, "_trusted", evicted_right_after_the_check)
    again = cache.path(a)
    assert again.read_bytes() == (tmp_path / "served" / "a.tar").read_bytes() and server.counts["a.tar"] == 2


def test_an_entry_evicted_by_another_process_as_soon_as_it_is_downloaded_is_fetched_again(
    server: DatasetServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The eviction can land between the download's rename into place and its stamp: fetched
    again too, not a FileNotFoundError."""
    cache = ShardCache(tmp_path / "cache", max_bytes=10**6)
    a = remote(server, "a")
    stamp, evictions = cache._stamp, [1]

    def evicted_before_the_stamp(path: Path) -> None:
        if evictions:
            path.unlink()
            evictions.pop()
        stamp(path)

    monkeypatch.setattr(cache, "_stamp", evicted_before_the_stamp)
    got = cache.path(a)
    assert got.read_bytes() == (tmp_path / "served" / "a.tar").read_bytes() and server.counts["a.tar"] == 2


def test_a_modified_or_truncated_entry_is_fetched_again(server: DatasetServer, tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", max_bytes=10**6)
    a, b = remote(server, "a"), remote(server, "b", checksum=False)
    source_a, source_b = (tmp_path / "served" / "a.tar").read_bytes(), (tmp_path / "served" / "b.tar").read_bytes()
    entry_a, entry_b = cache.path(a), cache.path(b)
    entry_a.write_bytes(bytes(1000))  # same size, other bytes, a new mtime: the stamp no longer matches
    os.utime(entry_a, ns=(1, 1))
    assert cache.path(a).read_bytes() == source_a and server.counts["a.tar"] == 2
    entry_b.write_bytes(source_b[:999])  # no checksum to compare: the size still tells
    assert cache.path(b).read_bytes() == source_b and server.counts["b.tar"] == 2


def test_an_unstamped_entry_that_still_matches_its_checksum_is_kept(server: DatasetServer, tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", max_bytes=10**6)
    a = remote(server, "a")
    entry = cache.path(a)
    stamps = [p for p in entry.parent.iterdir() if p.name.startswith(entry.name) and p != entry]
    assert stamps
    for stamp in stamps:
        stamp.unlink()
    assert cache.path(a) == entry and server.counts["a.tar"] == 1  # re-hashed, not re-fetched


def test_the_least_recently_used_entries_go_first_and_an_exact_fit_evicts_nothing(server: DatasetServer, tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", max_bytes=2000)
    cache.path(remote(server, "a"))
    cache.path(remote(server, "b"))
    assert cached(cache, server) == {"a", "b"} and cache.size() == 2000  # exactly at the limit
    cache.path(remote(server, "a"))  # a is now the most recently used
    cache.path(remote(server, "c"))
    assert cached(cache, server) == {"a", "c"} and cache.size() == 2000
    assert server.counts["a.tar"] == 1
    cache.path(remote(server, "e"))  # 2000 bytes: both others go
    assert cached(cache, server) == {"e"} and cache.size() == 2000
    cache.path(remote(server, "d"))
    assert cached(cache, server) == {"d"} and cache.size() == 1000


def test_an_entry_whose_stamp_was_lost_is_still_evicted(server: DatasetServer, tmp_path: Path) -> None:
    """A process killed between a download's rename and its stamp leaves an unstamped entry."""
    cache = ShardCache(tmp_path / "cache", max_bytes=1000)
    entry = cache.path(remote(server, "a"))
    for beside in [p for p in entry.parent.iterdir() if p.name.startswith(entry.name) and p != entry]:
        beside.unlink()
    cache.path(remote(server, "b"))
    assert cached(cache, server) == {"b"}


def test_a_download_in_progress_counts_against_the_limit(server: DatasetServer, tmp_path: Path) -> None:
    """While b downloads (slowly) its size is reserved, so fetching c evicts a to stay under 2000."""
    cache = ShardCache(tmp_path / "cache", max_bytes=2000)
    cache.path(remote(server, "a"))
    server.faults["b.tar"] = ["slow"]
    slow = threading.Thread(target=cache.path, args=(remote(server, "b"),))
    slow.start()
    while server.counts["b.tar"] == 0:
        threading.Event().wait(0.01)
    cache.path(remote(server, "c"))
    slow.join()
    assert cached(cache, server) == {"b", "c"} and cache.size() == 2000


def test_a_download_killed_mid_way_stops_counting_and_leaves_nothing(server: DatasetServer, tmp_path: Path) -> None:
    """A process SIGKILLed while downloading b (slowly) leaves its reservation and partial file:
    the next fetch finds nobody holding b's lock, removes both and counts neither, so a and c
    both fit under 2000 (the reservation would have evicted a for good)."""
    import signal
    import subprocess
    import sys

    server.faults["b.tar"] = ["slow"]
    code = (
        "import sys; from fastload.storage.cache import RemoteFile, ShardCache\n"
        "ShardCache(sys.argv[1], max_bytes=2000).path(RemoteFile(sys.argv[2], 'b.tar', None, 1000))"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "cache"), remote(server, "b").url], cwd=Path(__file__).resolve().parents[2])
    while server.counts["b.tar"] == 0 or not list((tmp_path / "cache").glob(".*.reserved")):
        threading.Event().wait(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait()
    cache = ShardCache(tmp_path / "cache", max_bytes=2000)
    cache.path(remote(server, "a"))
    cache.path(remote(server, "c"))
    assert cached(cache, server) == {"a", "c"} and cache.size() == 2000
    assert not [p.name for p in (tmp_path / "cache").iterdir() if ".reserved" in p.name or ".part-" in p.name]


def test_only_entries_count_towards_the_size(server: DatasetServer, tmp_path: Path) -> None:
    """Stamps, locks, hidden files and the staging folder of conversions to a URL are not entries."""
    cache = ShardCache(tmp_path / "cache", max_bytes=10**6)
    (cache.root / "staging" / "conversion").mkdir(parents=True)
    (cache.root / "staging" / "conversion" / "part.tar").write_bytes(bytes(5000))
    (cache.root / ".hidden.tar.part-1").write_bytes(bytes(7000))
    cache.path(remote(server, "a"))
    cache.path(remote(server, "e"))
    assert cache.size() == 3000


def test_entries_are_named_by_content_or_else_by_url(server: DatasetServer, tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", max_bytes=10**6)
    a = remote(server, "a")
    assert cache.entry(a) == cache.root / f"{a.sha256}.tar"
    twin = RemoteFile("http://elsewhere/x/shard-7.tar", "x/shard-7.tar", a.sha256, a.bytes)  # another dataset, same shard
    assert cache.entry(twin) == cache.entry(a)
    unchecked = remote(server, "a", checksum=False)
    assert cache.entry(unchecked) == cache.root / f"url-{hashlib.sha256(unchecked.url.encode()).hexdigest()}.tar"


def test_a_missing_cache_folder_is_created_with_its_parents(server: DatasetServer, tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "not" / "yet" / "there", max_bytes=10**6)
    assert cache.path(remote(server, "a")).parent == tmp_path / "not" / "yet" / "there"


def test_the_limit_must_be_positive(tmp_path: Path) -> None:
    assert ShardCache(tmp_path / "one", max_bytes=1).max_bytes == 1
    with pytest.raises(ValueError, match="the cache size limit must be positive"):
        ShardCache(tmp_path / "zero", max_bytes=0)


def test_cache_folder_and_limit_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As docs/object-storage.md says: FASTLOAD_CACHE_DIR, else $XDG_CACHE_HOME/fastload, else ~/.cache/fastload;
    FASTLOAD_CACHE_SIZE, else 50 GB."""
    for name in ("FASTLOAD_CACHE_DIR", "XDG_CACHE_HOME", "FASTLOAD_CACHE_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "fastload"
    assert default_cache_bytes() == 50_000_000_000
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "fastload"
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("FASTLOAD_CACHE_SIZE", "20MB")
    assert default_cache_bytes() == 20_000_000
    assert ShardCache().root == tmp_path / "mine" and ShardCache().max_bytes == 20_000_000

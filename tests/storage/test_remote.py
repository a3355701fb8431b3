"""Datasets on object storage, against real servers on loopback: an HTTP server serving a converted
dataset (one variant injecting failures, slow answers and endless bodies) and moto's S3 server for
s3:// reads and writes. Covers download-once, retries, permanent errors naming the URL, every
download bounded, the cache limit, a corrupted cache entry, the index broadcast, and convert to a
URL with resume."""

from __future__ import annotations

import functools
import json
import logging
import shutil
import socket
import socketserver
import struct
import threading
import time
from collections import Counter
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.errors import RemoteError
from fastload.storage.cache import RemoteFile
from tests.conftest import jpeg_bytes, run_cli, small_photo, tree_bytes
from tests.hostile_data import run_limited

pytestmark = pytest.mark.timeout(240)


class FaultyHandler(SimpleHTTPRequestHandler):
    """Serves files; the server's ``faults[path]`` lists what to do to the next requests."""

    def do_GET(self) -> None:
        path = self.path.split("?")[0].lstrip("/")
        server: DatasetServer = self.server  # type: ignore[assignment]
        with server.lock:
            server.counts[path] += 1
            pending = server.faults.get(path)
            action = pending.pop(0) if pending else None
        if action is not None and action.isdigit():  # an error status: "503", "403", ...
            self.send_error(int(action), "as told")
        elif action == "reset":  # RST instead of an answer
            self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
        elif action == "slow":
            time.sleep(server.slow_seconds)
            super().do_GET()
        elif action == "endless":  # a body with no length that never ends: it runs until the client hangs up
            self.send_response(200)
            self.end_headers()
            self.close_connection = True
            block = bytes(1 << 16)
            try:
                while True:
                    self.wfile.write(block)
            except OSError:
                pass
        elif action in ("truncate", "corrupt"):
            data = bytearray((Path(self.directory) / path).read_bytes())
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if action == "corrupt":
                data[len(data) // 2] ^= 0xFF
                self.wfile.write(bytes(data))
            else:
                self.wfile.write(bytes(data[: len(data) // 2]))
                self.close_connection = True
        else:
            super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


class DatasetServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, directory: Path) -> None:
        super().__init__(("127.0.0.1", 0), functools.partial(FaultyHandler, directory=str(directory)))
        self.counts: Counter[str] = Counter()
        self.faults: dict[str, list[str]] = {}
        self.slow_seconds = 3.0
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        pass  # clients that gave up on a slow answer break the pipe: expected here

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


@pytest.fixture(scope="module")
def local_wds(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("remote-src") / "wds"
    convert(str(image_folder), str(out), ConvertOptions(source="imagefolder", samples_per_shard=8))
    return out


@pytest.fixture()
def served(local_wds: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("FASTLOAD_RETRY_DELAY", "0.05")
    root = tmp_path / "served"
    shutil.copytree(local_wds, root)
    server = DatasetServer(root)
    yield server, root
    server.shutdown()
    server.server_close()


def load_all(dataset, **kwargs) -> tuple[list[str], np.ndarray]:  # type: ignore[no-untyped-def]
    keys, images = [], []
    with fastload.DataLoader(dataset, batch_size=4, transform=T.val(16), return_keys=True, **kwargs) as loader:
        for x, _, k in loader:
            keys += k
            images.append(x.numpy())
    return keys, np.concatenate(images)


def test_http_dataset_loads_like_local_and_downloads_each_shard_once(served, local_wds: Path, tmp_path: Path) -> None:
    server, root = served
    remote = fastload.open(server.url, cache_dir=tmp_path / "cache")
    assert len(remote) == 30 and remote.classes == fastload.open(local_wds).classes
    keys, images = load_all(remote, num_workers=2)
    local_keys, local_images = load_all(fastload.open(local_wds), num_workers=0)
    assert keys == local_keys and np.array_equal(images, local_images)
    shard_files = [p.name for p in root.iterdir() if p.suffix in (".tar", ".idx")]
    assert len(shard_files) == 8
    assert all(server.counts[name] == 1 for name in shard_files), server.counts  # two workers + prefetch: once each
    assert server.counts["index.json"] == 1


def test_without_workers_the_next_shards_are_fetched_before_the_batches_that_read_them(served, local_wds: Path, tmp_path: Path) -> None:
    server, _ = served
    remote = fastload.open(server.url, cache_dir=tmp_path / "cache")
    shards = [shard.path for shard in remote.index.shards]  # 8 samples each: batches of 4 read shard s at steps 2s and 2s + 1
    assert len(shards) == 4
    with fastload.DataLoader(remote, batch_size=4, transform=T.val(16), return_keys=True) as loader:
        got = iter(loader)  # in the training process: it reads a shard only when its batch is made
        keys = [key for _ in range(2) for key in next(got)[2]]  # steps 0 and 1: shard 0 only
        deadline = time.monotonic() + 30  # only guards a hang: fetched once 2 steps are made (SHARDS_AHEAD beyond shard 1, first read at step 2)
        while not server.counts[shards[3]] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.counts[shards[3]] == 1, server.counts
        keys += [key for _, _, batch_keys in got for key in batch_keys]
    assert keys == load_all(fastload.open(local_wds), num_workers=0)[0]
    assert all(server.counts[name] == 1 for name in shards), server.counts  # fetched ahead, read from the cache: once each


def test_dali_backend_reads_a_url(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("nvidia.dali")
    server, root = served
    keys, images = load_all(fastload.open(server.url, cache_dir=tmp_path / "cache"), backend="dali", shuffle=True)
    assert sorted(keys) == sorted(fastload.open(root).raw(i)[0] for i in range(30))
    assert images.shape == (30, 3, 16, 16)
    assert all(server.counts[p.name] == 1 for p in root.glob("*.tar"))


def test_hdf5_dataset_over_http(image_folder: Path, tmp_path: Path) -> None:
    local = tmp_path / "h5"
    convert(str(image_folder), str(local), ConvertOptions(source="imagefolder", layout="hdf5", samples_per_shard=8))
    server = DatasetServer(local)
    try:
        keys, images = load_all(fastload.open(server.url, cache_dir=tmp_path / "cache"), num_workers=2)
    finally:
        server.shutdown()
        server.server_close()
    local_keys, local_images = load_all(fastload.open(local))
    assert keys == local_keys and np.array_equal(images, local_images)
    assert all(server.counts[p.name] == 1 for p in local.glob("*.h5"))


def test_inspect_and_verify_a_url(served) -> None:  # type: ignore[no-untyped-def]
    server, root = served
    summary = json.loads(run_cli("inspect", server.url, "--json").stdout)
    assert summary["samples"] == 30 and summary["shards"] == 4
    assert "4 shards, 30 samples verified and decoded: OK" in run_cli("verify", server.url, "--decode").stdout
    shard = root / "shard-00002.tar"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x10
    shard.write_bytes(bytes(data))
    bad = run_cli("verify", server.url, check=False)
    assert bad.returncode == 1
    assert "BAD shard-00002.tar" in bad.stderr and "sha256" in bad.stderr and "shard-00001" not in bad.stderr


def test_transient_failures_are_retried(served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server, root = served
    monkeypatch.setenv("FASTLOAD_IO_TIMEOUT", "1")
    server.faults.update({
        "shard-00000.tar": ["503", "503"], "shard-00001.tar": ["reset"],
        "shard-00002.tar": ["slow"], "shard-00003.tar": ["truncate"], "shard-00003.idx": ["corrupt"],
    })
    keys, _ = load_all(fastload.open(server.url, cache_dir=tmp_path / "cache"), num_workers=2, shuffle=True)
    assert sorted(keys) == sorted(fastload.open(root).raw(i)[0] for i in range(30))
    assert server.counts["shard-00000.tar"] == 3 and server.counts["shard-00001.tar"] == 2
    assert server.counts["shard-00002.tar"] == 2 and server.counts["shard-00003.tar"] == 2
    assert server.counts["shard-00003.idx"] == 2


def test_permanent_failures_raise_naming_the_url(served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server, root = served
    monkeypatch.setenv("FASTLOAD_RETRIES", "3")
    (root / "shard-00001.tar").unlink()
    start = time.perf_counter()
    with pytest.raises(RemoteError, match=r"http://127\.0\.0\.1:\d+/shard-00001\.tar: not found"):
        load_all(fastload.open(server.url, cache_dir=tmp_path / "c1"), num_workers=2)
    # a 404 is not retried: at most one request by each process that wanted it (2 workers, the prefetcher)
    assert time.perf_counter() - start < 20 and 1 <= server.counts["shard-00001.tar"] <= 3
    server.faults["shard-00002.tar"] = ["corrupt"] * 10
    with pytest.raises(RemoteError, match=r"shard-00002\.tar: cannot download it after 3 attempts.*sha256"):
        fastload.open(server.url, cache_dir=tmp_path / "c2").fetch(2)
    with pytest.raises(RemoteError, match="index.json: not found"):
        fastload.open(server.url + "nothing-here/", cache_dir=tmp_path / "c3")


@pytest.mark.parametrize("status,answer", [(401, "401 (Unauthorized)"), (403, "403 (Forbidden)"), (500, "500 (Internal Server Error)")])
def test_a_server_refusing_with_a_status_is_named_by_it_not_as_not_found(served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                         status: int, answer: str) -> None:
    """401, 403 and 500 (500 retried) read as "not found" for index.json (fsspec's HTTP lookup raises
    FileNotFoundError from any failure): the message says what the server answered; a 404 alone is "not found"."""
    server, _ = served
    monkeypatch.setenv("FASTLOAD_RETRIES", "2")
    asks = 2 if status >= 500 else 1  # a 5xx is asked again
    tries = " after 2 attempts" if asks == 2 else ""
    server.faults["index.json"] = [str(status)] * asks
    with pytest.raises(RemoteError) as failed:
        fastload.open(server.url, cache_dir=tmp_path / "c1")
    assert str(failed.value) == f"{server.url}index.json: cannot read it{tries}: the server answered {answer}"
    assert server.counts["index.json"] == asks
    dataset = fastload.open(server.url, cache_dir=tmp_path / "c2")
    server.faults["shard-00001.tar"] = [str(status)] * asks
    with pytest.raises(RemoteError) as failed:
        dataset.fetch(1)
    assert str(failed.value) == f"{server.url}shard-00001.tar: cannot download it{tries}: the server answered {answer}"
    server.faults["index.json"] = ["404"]
    with pytest.raises(RemoteError, match=r"index\.json: not found \(while trying to read it\)$"):
        fastload.open(server.url, cache_dir=tmp_path / "c3")


@pytest.mark.parametrize("name", ["shard-00001.tar", "shard-00001.idx", "shard-00001.table"])
def test_an_endless_shard_download_stops_at_the_size_the_index_declares(served, tmp_path: Path, name: str) -> None:
    """A shard by its declared size; its .idx and table, which the index gives no size, by 64 MiB."""
    server, root = served
    server.faults[name] = ["endless"]
    ds = fastload.open(server.url, cache_dir=tmp_path / "cache")
    start = time.perf_counter()
    with pytest.raises(RemoteError) as caught:
        ds.fetch(1)
    bound = ds.index.shards[1].bytes if name.endswith(".tar") else 64 << 20
    assert str(caught.value) == f"{server.url}{name}: the server sent more than {bound} bytes, the most expected of it; download stopped"
    assert time.perf_counter() - start < 20 and server.counts[name] == 1  # cut off at once, not asked again
    left = [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]
    assert all(".tmp-" not in p.name and ".reserved" not in p.name for p in left), left  # the partial file is gone
    assert sum(p.stat().st_size for p in left) < 2 * max(p.stat().st_size for p in root.glob("*.tar"))
    assert len(ds.raw(9)[1]) > 0  # the next request gets the real file


def test_an_endless_index_json_stops_at_its_cap_in_bounded_memory(served, tmp_path: Path) -> None:
    server, _ = served
    server.faults["index.json"] = ["endless"] * 3
    got = run_limited(f"""
        import json
        import fastload
        from fastload.errors import RemoteError
        try:
            fastload.open({server.url!r}, cache_dir={str(tmp_path / "cache")!r})
        except RemoteError as exc:
            print(json.dumps(str(exc)))
    """, memory_bytes=2 << 30, timeout=60)
    assert got == f"{server.url}index.json: the server sent more than {64 << 20} bytes, the most expected of it; download stopped"
    assert server.counts["index.json"] == 1


def test_fastload_index_url_stops_a_scratch_copy_at_the_tars_listed_size(served, tmp_path: Path) -> None:
    server, root = served
    server.faults["shard-00000.tar"] = ["endless"] * 3  # the first tar: its error is the one raised (the server takes no uploads)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = run_cli("index", server.url, "--force", "--scratch", str(scratch), check=False)
    size = (root / "shard-00000.tar").stat().st_size
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"fastload index: error: {server.url}shard-00000.tar: the server sent more than {size} bytes, the most expected of it; download stopped"
    ]
    assert server.counts["shard-00000.tar"] == 1 and not list(scratch.iterdir())  # no scratch copy left


def test_cache_stays_under_its_limit(served, tmp_path: Path) -> None:
    server, root = served
    shard_bytes = max(p.stat().st_size for p in root.glob("*.tar"))
    limit = int(2.5 * shard_bytes)
    staging = tmp_path / "cache" / "staging" / "some-conversion"  # conversions to URLs stage here
    staging.mkdir(parents=True)
    ds = fastload.open(server.url, cache_dir=tmp_path / "cache", cache_size=limit)
    keys = []
    with fastload.DataLoader(ds, batch_size=4, shuffle=True, transform=T.val(16), return_keys=True, num_workers=2) as loader:
        for _, _, k in loader:
            keys += k
            assert ds.cache.size() <= limit
    assert sorted(keys) == sorted(ds.raw(i)[0] for i in range(30))  # raw() fetches again what was evicted
    assert ds.cache.size() <= limit
    assert sum(server.counts[p.name] for p in root.glob("*.tar")) > 4  # evicted shards came back
    assert staging.is_dir()  # eviction takes cache entries only


def test_corrupted_cache_entry_is_fetched_again(served, tmp_path: Path) -> None:
    server, _ = served
    ds = fastload.open(server.url, cache_dir=tmp_path / "cache")
    first = load_all(ds)
    cached = ds.cache.entry(RemoteFile("", "x.tar", ds.index.shards[1].sha256, None))
    with open(cached, "r+b") as f:
        f.seek(cached.stat().st_size // 2)
        f.write(b"\xff\x00\xff")
    again = load_all(fastload.open(server.url, cache_dir=tmp_path / "cache"))
    assert first[0] == again[0] and np.array_equal(first[1], again[1])
    assert server.counts["shard-00001.tar"] == 2 and server.counts["shard-00000.tar"] == 1


def _rank_reads(rank: int, world: int, init: str, url: str, cache: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    ds = fastload.open(url, cache_dir=cache)
    with fastload.DataLoader(ds, batch_size=3, shuffle=True, transform=T.val(16), return_keys=True, num_workers=1) as loader:
        keys = [k for _, _, ks in loader for k in ks]
    Path(out, f"rank{rank}.json").write_text(json.dumps(keys))
    dist.barrier()
    dist.destroy_process_group()


def test_ranks_share_one_index_read_and_fetch_only_their_own_shards(served, tmp_path: Path) -> None:
    server, root = served
    mp.spawn(_rank_reads, args=(2, str(tmp_path / "init"), server.url, str(tmp_path / "cache"), str(tmp_path)), nprocs=2)
    per_rank = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert server.counts["index.json"] == 1  # rank 0 read it and broadcast it
    assert set(per_rank[0]) | set(per_rank[1]) == {fastload.open(root).raw(i)[0] for i in range(30)}
    assert all(server.counts[p.name] == 1 for p in root.glob("*.tar"))


# --- S3, on moto's server ------------------------------------------------------------------------


def test_convert_to_s3_is_identical_to_local_and_loads(s3_endpoint, image_folder: Path, local_wds: Path, tmp_path: Path) -> None:
    url = "s3://fastload-test/ds1"
    report = convert(str(image_folder), url, ConvertOptions(source="imagefolder", samples_per_shard=8, workers=2), quiet=True)
    assert report.shards_written == 4
    s3_endpoint.get(url.removeprefix("s3://") + "/", str(tmp_path / "down") + "/", recursive=True)
    assert tree_bytes(tmp_path / "down") == tree_bytes(local_wds)
    index_text = (tmp_path / "down" / "index.json").read_text()
    assert "fastload-test-secret" not in index_text and "fastload-test-key" not in index_text
    keys, images = load_all(fastload.open(url, cache_dir=tmp_path / "cache"), num_workers=2)
    local_keys, local_images = load_all(fastload.open(local_wds))
    assert keys == local_keys and np.array_equal(images, local_images)
    again = convert(str(image_folder), url, ConvertOptions(source="imagefolder", samples_per_shard=8), quiet=True)
    assert again.already_complete


def test_interrupted_upload_resumes(s3_endpoint, tmp_path: Path) -> None:
    src = tmp_path / "src"
    for i in range(24):
        (src / "c").mkdir(parents=True, exist_ok=True)
        (src / "c" / f"{i:02d}.jpg").write_bytes(jpeg_bytes(small_photo(i)))
    (src / "c" / "20.jpg").write_bytes(b"not a jpeg")  # fails the run at the shard holding it
    url = "s3://fastload-test/ds2"
    options = ConvertOptions(source="imagefolder", samples_per_shard=4, workers=1)
    staging = tmp_path / "staging"
    with pytest.raises(fastload.SampleError, match="20.jpg"):
        convert(str(src), url, options, quiet=True, staging=str(staging))
    uploaded = {Path(p).name for p in s3_endpoint.ls("fastload-test/ds2")}
    assert "index.json" not in uploaded and {"shard-00000.tar", "shard-00000.idx"} <= uploaded
    assert not list(staging.glob("shard-*"))  # uploaded shards leave staging
    (src / "c" / "20.jpg").write_bytes(jpeg_bytes(small_photo(20)))
    report = convert(str(src), url, options, quiet=True, staging=str(staging))
    assert report.shards_reused >= 1 and report.shards_reused + report.shards_written == 6
    assert len(fastload.open(url, cache_dir=tmp_path / "cache")) == 24
    assert not staging.exists()


def test_index_foreign_tars_in_s3_in_place(s3_endpoint, tmp_path: Path) -> None:
    """`fastload index s3://...` writes the same .idx files and index.json as indexing the same tars
    locally, beside the tars (not rewritten), and the dataset then loads from the URL."""
    wds = pytest.importorskip("webdataset")
    local = tmp_path / "local"
    local.mkdir()
    for shard in range(3):
        with wds.TarWriter(str(local / f"part-{shard:03d}.tar")) as writer:
            for i in range(shard * 5, shard * 5 + 5):
                writer.write({"__key__": f"{i:06d}", "jpg": jpeg_bytes(small_photo(i)), "txt": f"caption {i}", "cls": str(i % 3)})
    url = "s3://fastload-test/foreign"
    s3_endpoint.put(str(local) + "/", url.removeprefix("s3://") + "/", recursive=True)
    tars = {name: (local / name).read_bytes() for name in sorted(p.name for p in local.glob("*.tar"))}
    proc = run_cli("index", url, "--scratch", str(tmp_path))
    assert "indexed 15 samples in 3 tars" in proc.stdout
    assert run_cli("index", url, check=False).stderr.count("exists: pass --force") == 1
    run_cli("index", str(local))  # the same tars indexed in their folder
    down = tmp_path / "down"
    s3_endpoint.get(url.removeprefix("s3://") + "/", str(down) + "/", recursive=True)
    assert tree_bytes(down) == tree_bytes(local) and {n: (down / n).read_bytes() for n in tars} == tars
    assert not list(tmp_path.glob("fastload-index-*"))  # the scratch copies are gone
    dl = fastload.DataLoader(fastload.open(url, cache_dir=tmp_path / "cache"), batch_size=5, shuffle=False, fields=["txt", "cls"])
    batches = list(dl)
    assert [text for captions, _ in batches for text in captions] == [f"caption {i}" for i in range(15)]
    assert [label for _, labels in batches for label in labels.tolist()] == [i % 3 for i in range(15)]


def test_index_url_names_the_bad_tar_by_its_url(s3_endpoint, tmp_path: Path) -> None:
    s3_endpoint.pipe("fastload-test/badtar/a.tar", b"x" * 2048)
    proc = run_cli("index", "s3://fastload-test/badtar", check=False)
    assert proc.returncode == 2 and "error: s3://fastload-test/badtar/a.tar: not a readable tar (a tar header holds a malformed number)" in proc.stderr
    assert str(tmp_path) not in proc.stderr and "fastload-index-" not in proc.stderr


@pytest.mark.parametrize("credential", ["SECRETTOKEN@", "user:SECRETPW@", ":SECRETPW@"])
def test_errors_and_logs_never_show_a_urls_credentials(served, tmp_path: Path, credential: str,  # type: ignore[no-untyped-def]
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A URL carrying a token alone (``https://TOKEN@host/...``) or a user and password: the
    dataset's name, a retried download's log lines and a failure's message name the URL without it."""
    server, root = served
    url = server.url.replace("http://", f"http://{credential}")
    ds = fastload.open(url, cache_dir=tmp_path / "cache")
    assert ds.location == server.url.rstrip("/") and "SECRET" not in repr(ds)
    (root / "shard-00001.tar").unlink()  # gone from the server: a failure naming it
    with caplog.at_level(logging.INFO, logger="fastload"), pytest.raises(RemoteError) as failed:
        ds.fetch(1)
    assert "shard-00001.tar" in str(failed.value) and "SECRET" not in str(failed.value)
    assert "SECRET" not in caplog.text
    (root / "shard-00001.tar").write_bytes(b"")  # back, damaged: verify reports it
    for args in (["inspect", url], ["verify", url], ["overlap", url, url, "--json"]):
        proc = run_cli(*args, check=False)
        assert proc.stdout + proc.stderr and "SECRET" not in proc.stdout + proc.stderr, args


@pytest.mark.parametrize("url", ["http://SECRETTOKEN@[::1]:9/ds", "http://u:SECRETPW@[::1]:9/ds"])
def test_redacting_keeps_an_ipv6_host_as_written(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLOAD_RETRY_DELAY", "0.01")
    with pytest.raises(RemoteError) as failed:
        fastload.open(url)  # nothing listens on port 9
    assert str(failed.value).startswith("http://[::1]:9/ds/index.json: ") and "SECRET" not in str(failed.value)


class RefusingFtpHandler(socketserver.StreamRequestHandler):
    """An FTP server that asks for a password, records the login it was given and refuses it."""

    def handle(self) -> None:
        self.wfile.write(b"220 fastload test server\r\n")
        for line in self.rfile:
            command = line.decode().strip()
            self.server.commands.append(command)  # type: ignore[attr-defined]
            if command.startswith("USER "):
                self.wfile.write(b"331 Password required\r\n")
            else:
                self.wfile.write(b"530 Login incorrect.\r\n")
                return


def test_an_ftp_url_reaches_its_host_with_its_login_and_a_failure_is_one_line_without_it(tmp_path: Path) -> None:
    """ftp:// (a filesystem that takes its host, port and login from the URL, not its path) was a
    TypeError traceback before connecting; now the server is asked, and its refusal is one line
    naming the URL without the credentials."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), RefusingFtpHandler)
    server.commands = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"ftp://reader:SECRETPW@127.0.0.1:{server.server_address[1]}/data"
    try:
        with pytest.raises(RemoteError) as failed:
            fastload.open(url, cache_dir=tmp_path / "cache")
        assert str(failed.value) == (f"ftp://127.0.0.1:{server.server_address[1]}/data/index.json: cannot open its ftp:// "
                                     "filesystem: error_perm: 530 Login incorrect.")
        assert server.commands[:2] == ["USER reader", "PASS SECRETPW"]  # type: ignore[attr-defined]
        proc = run_cli("inspect", url, check=False)
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "530 Login incorrect" in proc.stderr
        assert "SECRET" not in proc.stderr and "Traceback" not in proc.stderr
    finally:
        server.shutdown()
        server.server_close()

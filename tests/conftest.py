"""Fixtures that generate small raw datasets of every supported kind (no network)."""

from __future__ import annotations

import gc
import gzip
import io
import json
import os
import pickle
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastload.cli.demo import DEMO_CLASSES, synthetic_image
from fastload.converters import ConvertOptions, convert
from fastload.formats.idx import parse_dali_index
from fastload.formats.index import read_index


def collection_page_faults() -> int:
    """The page faults one full garbage collection costs this process: in a forked worker, each
    page of inherited objects the collector writes to is copied and counts here."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    gc.collect()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


class WorkerLog:
    """A file the worker processes append a line to for each thing they do (a sample made, a span
    read), counted in the training process; named by the training process's pid, so the workers it
    forks write to the same file."""

    def __init__(self, name: str) -> None:
        self.path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"fastload-{name}-{os.getpid()}.log")

    def note(self) -> None:
        """One line more (called in a worker)."""
        with open(self.path, "a") as log:
            log.write("x\n")

    def count(self) -> int:
        """The lines so far."""
        try:
            with open(self.path) as log:
                return len(log.readlines())
        except FileNotFoundError:
            return 0

    def settled(self, expected: int = 0) -> int:
        """count() once it is at least ``expected`` and the workers have stopped adding to it (the
        30 s only guard a hang)."""
        deadline, count = time.monotonic() + 30, -1
        while self.count() < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        while count != self.count() and time.monotonic() < deadline:
            count = self.count()
            time.sleep(0.5)
        return count

    def clear(self) -> None:
        """Remove the file (counting starts at 0 again)."""
        if os.path.exists(self.path):
            os.unlink(self.path)

    def cleared(self) -> Iterator[None]:
        """A fixture's body: the log empty for the test and removed after it."""
        self.clear()
        yield
        self.clear()


def jpeg_bytes(image: Image.Image, quality: int = 90, **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality, **kwargs)
    return buf.getvalue()


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not zombies)."""
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def photo_folder(root: Path, count: int, size: tuple[int, int] = (64, 80), grow: int = 0) -> Path:
    """ROOT/cK/NNNN.jpg: ``count`` small JPEGs in 3 class folders, of ``size`` (height, width)
    plus ``grow`` pixels more on each side for each image before it."""
    for i in range(count):
        path = root / f"c{i % 3}" / f"{i:04d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpeg_bytes(small_photo(i, i % 3, (size[0] + grow * i, size[1] + grow * i))))
    return root


def demo_dataset(root: Path, count: int, samples_per_shard: int | None = None) -> Path:
    """ROOT/wds: ``count`` demo images at ImageNet-like sizes (300-640 px), converted."""
    from fastload.cli.demo import make_demo_images

    convert(str(make_demo_images(root / "raw", count)), str(root / "wds"),
            ConvertOptions(source="imagefolder", samples_per_shard=samples_per_shard))
    return root / "wds"


def small_photo(seed: int, label: int = 0, size: tuple[int, int] = (48, 64)) -> Image.Image:
    """A small smooth synthetic image (height, width)."""
    return synthetic_image(np.random.default_rng(seed), label, size[0], size[1])


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT/CLASS/img.jpg: 4 classes, 30 JPEGs of varied sizes."""
    root = tmp_path_factory.mktemp("imagefolder")
    for i in range(30):
        label = i % len(DEMO_CLASSES)
        path = root / DEMO_CLASSES[label] / f"img_{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpeg_bytes(small_photo(i, label, (40 + i, 60 + 2 * i))))
    return root


@pytest.fixture(scope="session")
def manifest_csv(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CSV manifest beside copies of the image folder's files, with string labels."""
    root = tmp_path_factory.mktemp("manifest")
    shutil.copytree(image_folder, root / "images")
    lines = ["file,category"]
    for path in sorted((root / "images").rglob("*.jpg")):
        lines.append(f"{path.relative_to(root).as_posix()},{path.parent.name}")
    (root / "list.csv").write_text("\n".join(lines) + "\n")
    return root / "list.csv"


@pytest.fixture(scope="session")
def manifest_jsonl(manifest_csv: Path) -> Path:
    """A JSONL manifest with integer labels, next to the CSV one."""
    rows = [line.split(",") for line in manifest_csv.read_text().splitlines()[1:]]
    path = manifest_csv.with_name("list.jsonl")
    path.write_text("".join(json.dumps({"path": p, "label": DEMO_CLASSES.index(c)}) + "\n" for p, c in rows))
    return path


@pytest.fixture(scope="session")
def cifar10_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CIFAR-10 "python version" layout with 5 tiny train batches and a test batch."""
    root = tmp_path_factory.mktemp("cifar") / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(0)
    names = [f"class{i}" for i in range(10)]
    with open(root / "batches.meta", "wb") as f:
        pickle.dump({"label_names": names, "num_cases_per_batch": 4}, f, protocol=2)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, 4)],
            b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
            b"filenames": [f"{name}_img{i}.png".encode() for i in range(4)],
        }
        with open(root / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    return root


@pytest.fixture(scope="session")
def mnist_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MNIST IDX files: train gzipped, test plain; 12 and 5 images of 28x28."""
    root = tmp_path_factory.mktemp("mnist")
    rng = np.random.default_rng(1)
    for prefix, count, gz in (("train", 12, True), ("t10k", 5, False)):
        images = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, count).astype(np.uint8)
        image_raw = bytes([0, 0, 8, 3]) + b"".join(v.to_bytes(4, "big") for v in (count, 28, 28)) + images.tobytes()
        label_raw = bytes([0, 0, 8, 1]) + count.to_bytes(4, "big") + labels.tobytes()
        for stem, raw in ((f"{prefix}-images-idx3-ubyte", image_raw), (f"{prefix}-labels-idx1-ubyte", label_raw)):
            if gz:
                (root / f"{stem}.gz").write_bytes(gzip.compress(raw, mtime=0))
            else:
                (root / stem).write_bytes(raw)
    return root


@pytest.fixture(scope="session")
def npz_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """images uint8[10,16,16,3] and labels int64[10] in an .npz."""
    path = tmp_path_factory.mktemp("npz") / "data.npz"
    rng = np.random.default_rng(2)
    np.savez(path, images=rng.integers(0, 256, (10, 16, 16, 3), dtype=np.uint8), labels=np.arange(10) % 3)
    return path


@pytest.fixture(scope="session")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two Parquet files shaped like a Hugging Face export: image {bytes, path} structs, a
    ClassLabel column whose names live in the schema's 'huggingface' metadata."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    root = tmp_path_factory.mktemp("parquet")
    features = {"info": {"features": {"image": {"_type": "Image"}, "label": {"names": ["cat", "dog"], "_type": "ClassLabel"}}}}
    for part in range(2):
        images = [{"bytes": jpeg_bytes(small_photo(100 + part * 10 + i)), "path": f"p{part}_{i}.jpg"} for i in range(7)]
        table = pa.table({"image": images, "label": [i % 2 for i in range(7)]})
        table = table.replace_schema_metadata({"huggingface": json.dumps(features)})
        pq.write_table(table, root / f"train-{part:05d}-of-00002.parquet", row_group_size=3)
    return root


@pytest.fixture(scope="session")
def clean(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("clean")
    convert(str(image_folder), str(out), ConvertOptions(source="imagefolder", samples_per_shard=8))
    return out


@pytest.fixture(scope="session")
def h5_clean(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image folder converted to HDF5 shards of 8 samples."""
    out = tmp_path_factory.mktemp("h5-clean")
    convert(str(image_folder), str(out), ConvertOptions(source="imagefolder", layout="hdf5", samples_per_shard=8))
    return out


@pytest.fixture()
def corrupt(clean: Path, tmp_path: Path) -> tuple[Path, set[str]]:
    """A copy whose shard 1 has one sample with a garbage header and one with garbage scan data."""
    out = tmp_path / "corrupt"
    shutil.copytree(clean, out)
    index = read_index(out)
    shard = out / index.shards[1].path
    members = parse_dali_index((out / index.shards[1].offsets).read_text(), "idx")
    data = bytearray(shard.read_bytes())
    fields_a, fields_b = members.spans(2), members.spans(5)
    offset, size = fields_a["jpg"]
    data[offset : offset + 16] = b"\xab" * 16
    offset, size = fields_b["jpg"]
    rng = np.random.default_rng(0)
    data[offset + size // 3 : offset + size - 2] = rng.integers(0, 256, size - 2 - size // 3, dtype=np.uint8).tobytes()
    shard.write_bytes(bytes(data))
    return out, {members.key(2), members.key(5)}


@pytest.fixture(scope="session")
def s3_endpoint():  # type: ignore[no-untyped-def]
    """moto's S3 server on loopback (as s3fs's own tests use), found through the standard AWS_*
    variables; yields an s3fs filesystem on it with the bucket ``fastload-test``."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")}
    os.environ.update(AWS_ACCESS_KEY_ID="fastload-test-key", AWS_SECRET_ACCESS_KEY="fastload-test-secret",
                      AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=f"http://{host}:{port}")
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True).mkdir("fastload-test")
    yield s3fs.S3FileSystem(skip_instance_cache=True)
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


REPO_ROOT = Path(__file__).resolve().parents[1]


def cli_env() -> dict[str, str]:
    """The environment in which the installed ``fastload`` command imports this checkout's code
    (an editable install elsewhere would otherwise win)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))}


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the installed ``fastload`` command on this checkout's code."""
    exe = Path(sys.executable).with_name("fastload")
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600, env=cli_env())
    if check and proc.returncode != 0:
        raise AssertionError(f"fastload {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run_script(args: list[str], timeout: int = 240) -> None:
    """Run a framework script (a plain command or :func:`torchrun`'s) on this checkout's code,
    outside any launcher this test runs under; its output's tail is the failure."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def torchrun(script: Path, *args: str) -> list[str]:
    """The command that runs ``script`` in 2 ranks under torchrun, on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
            f"--master-port={port}", str(script), *args]


def kill_like_a_dying_machine(proc: subprocess.Popen) -> None:
    """SIGKILL a launcher and every process under it (its ranks, their workers), and reap them."""
    import psutil

    tree = [proc, *psutil.Process(proc.pid).children(recursive=True)]
    for p in tree:
        os.kill(p.pid, signal.SIGKILL)
    proc.wait()
    psutil.wait_procs(tree[1:], timeout=10)


def drop_tables(root: Path) -> Path:
    """Make ``root`` a dataset converted before sample tables: its ``.table`` files gone and
    unlisted (so a reader finds positions through each shard's ``.idx``, building the table)."""
    for table in root.glob("*.table"):
        table.unlink()
    data = json.loads((root / "index.json").read_text())
    for shard in data["shards"]:
        shard.pop("table", None)
        shard.pop("table_sha256", None)
    (root / "index.json").write_text(json.dumps(data))
    return root


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, for byte-identity comparisons."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` where no CUDA device is visible (run them with ``pytest -m gpu``)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT/c0, ROOT/c1: six H.264 videos of 24, 30 and 40 frames (96x64, a keyframe every 8;
    tests/video/media.py)."""
    from tests.video.media import video_folder

    return video_folder(tmp_path_factory.mktemp("videos"))


@pytest.fixture(scope="session")
def video_dataset(videos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The video folder converted into shards of 4 samples."""
    out = tmp_path_factory.mktemp("video-wds")
    convert(str(videos), str(out), ConvertOptions(source="videos", samples_per_shard=4), quiet=True)
    return out

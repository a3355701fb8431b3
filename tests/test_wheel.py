"""The wheel users install: built by scripts/build_wheel.sh with libjpeg-turbo bundled, installed
into a fresh venv that sees only the wheel's declared dependencies, used from outside the checkout.
A broken extension warns once and falls back; a source build without a compiler notes why and works."""

from __future__ import annotations

import email
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import fastload
from fastload import transforms as T
from fastload.converters import ConvertOptions, convert
from fastload.decode import cpu
from tests.conftest import REPO_ROOT, tree_bytes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Loads the dataset argv[1] through the installed fastload's workers, saves the pixels to argv[2]
# and prints which fastload and which JPEG crop decoder did it, and where the near-duplicate index is.
LOAD = """
import json, sys
import numpy as np
import fastload
from fastload import transforms as T
from fastload.decode import cpu
from fastload.near import search
with fastload.DataLoader(sys.argv[1], batch_size=8, num_workers=2, transform=T.train(32), backend="cpu") as loader:
    np.save(sys.argv[2], np.concatenate([images.numpy() for images, _ in loader]))
print(json.dumps({"fastload": fastload.__file__, "decoder": cpu.jpeg_crop_decoder(), "turbo": getattr(cpu.turbo, "__file__", None),
                  "near_index": getattr(search.native, "__file__", None)}))
"""
Item = TypeVar("Item")
EXTENSION_NOTE = "note: fastload's libjpeg-turbo extension (fastload.decode._turbo) was not built"
NEAR_INDEX_NOTE = "note: fastload's near-duplicate index (fastload.near._index) was not built"


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would make the venv import the checkout or another venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, **extra}


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a command; a failure shows the end of its output."""
    proc = subprocess.run([str(a) for a in args], check=False, cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def only(items: list[Item]) -> Item:
    """The one item of ``items``."""
    assert len(items) == 1, items
    return items[0]


def build_bundled(out: Path, cwd: Path) -> Path:
    """The wheel as scripts/build_wheel.sh builds and repairs it."""
    run("bash", REPO_ROOT / "scripts" / "build_wheel.sh", out, cwd=cwd, env=clean_env(PYTHON=sys.executable))
    return only(sorted(out.glob("*.whl")))


def build_plain(out: Path, cwd: Path, **env: str) -> tuple[Path, str]:
    """A plain source build (sdist, then the wheel from it) and what the build printed."""
    proc = run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, REPO_ROOT, cwd=cwd, env=clean_env(**env))
    return only(sorted(out.glob("*.whl"))), proc.stdout + proc.stderr


def declared_dependencies(wheel: Path) -> list[importlib.metadata.Distribution]:
    """The installed distributions the wheel's Requires-Dist (no extras) reaches, transitively."""
    with zipfile.ZipFile(wheel) as zf:
        metadata = email.message_from_bytes(zf.read(only([n for n in zf.namelist() if n.endswith(".dist-info/METADATA")])))
    todo, found = [(Requirement(r), {""}) for r in metadata.get_all("Requires-Dist")], {}
    while todo:
        req, extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        name = canonicalize_name(req.name)
        if name not in found:
            found[name] = importlib.metadata.distribution(req.name)
            todo += [(Requirement(r), {"", *req.extras}) for r in found[name].requires or []]
    return list(found.values())


def dependencies_dir(wheel: Path, root: Path) -> Path:
    """A folder of links to exactly the declared dependencies' files in this (the project's) venv."""
    root.mkdir()
    for dist in declared_dependencies(wheel):
        assert dist.files is not None, f"{dist.metadata['Name']} has no RECORD"
        for top in {f.parts[0] for f in dist.files} - {"..", "__pycache__"}:
            if not (root / top).exists():
                (root / top).symlink_to(dist.locate_file(top))
    return root


def venv_with(wheel: Path, deps: Path, root: Path) -> Path:
    """A fresh venv (no system site-packages) with the wheel installed and ``deps`` on its path."""
    run(sys.executable, "-m", "venv", "--without-pip", root, cwd=root.parent)
    site = Path(run(root / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=root).stdout.strip())
    (site / "fastload_test_deps.pth").write_text(f"{deps}\n")
    run(sys.executable, "-m", "pip", "--python", root / "bin" / "python", "install", "-q", "--no-deps", "--no-index", wheel, cwd=root)
    return site


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The repaired wheel, and the folder of its declared dependencies."""
    root = tmp_path_factory.mktemp("wheel")
    wheel = build_bundled(root / "dist", cwd=root)
    return wheel, dependencies_dir(wheel, root / "deps")


@pytest.fixture(scope="module")
def dataset(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image folder converted by the checkout."""
    out = tmp_path_factory.mktemp("wheel-ds") / "wds"
    convert(str(image_folder), str(out), ConvertOptions(source="imagefolder", samples_per_shard=8))
    return out


def load(site: Path, dataset: Path, cwd: Path) -> tuple[dict, np.ndarray, str]:
    """LOAD run by the venv's python from ``cwd``: its report, the pixels, and its stderr."""
    proc = run(site.parents[2] / "bin" / "python", "-c", LOAD, dataset, cwd / "images.npy", cwd=cwd)
    return json.loads(proc.stdout.splitlines()[-1]), np.load(cwd / "images.npy"), proc.stderr


def checkout_images(dataset: Path) -> np.ndarray:
    """The same loader, in this process, on the checkout's code and its extension."""
    assert cpu.turbo is not None, "the checkout's libjpeg-turbo extension is not built (scripts/env.sh installs gcc, libjpeg-dev)"
    with fastload.DataLoader(str(dataset), batch_size=8, num_workers=2, transform=T.train(32), backend="cpu") as loader:
        return np.concatenate([images.numpy() for images, _ in loader])


def test_wheel_bundles_libjpeg_turbo_and_loads_through_it(
    bundled: tuple[Path, Path], image_folder: Path, dataset: Path, tmp_path: Path
) -> None:
    wheel, deps = bundled
    assert re.fullmatch(r"fastload-[\d.]+-cp\d+-cp\d+-.*manylinux_\d+_\d+_\w+\.whl", wheel.name), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if re.fullmatch(r"fastload\.libs/libjpeg-[0-9a-f]{8}\.so[.\d]*", n)], names
    assert not [n for n in names if n.endswith(".c")]
    site = venv_with(wheel, deps, tmp_path / "venv")

    extension = only(sorted((site / "fastload" / "decode").glob("_turbo*.so")))
    dynamic = run("readelf", "-d", extension, cwd=tmp_path).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", dynamic)
    jpeg = only([n for n in needed if "jpeg" in n])
    assert re.fullmatch(r"libjpeg-[0-9a-f]{8}\.so[.\d]*", jpeg), needed  # never the system's libjpeg.so.62
    assert "$ORIGIN/../../fastload.libs" in re.search(r"\((?:RPATH|RUNPATH)\)\s+Library \w+: \[(.+)\]", dynamic).group(1)
    resolved = re.search(rf"{re.escape(jpeg)} => (\S+)", run("ldd", extension, cwd=tmp_path).stdout).group(1)
    assert Path(resolved).resolve() == (site / "fastload.libs" / jpeg).resolve()

    fastload_command = site.parents[2] / "bin" / "fastload"
    run(fastload_command, "convert", image_folder, tmp_path / "wds", "--from", "imagefolder", "--samples-per-shard", "8", cwd=tmp_path)
    assert tree_bytes(tmp_path / "wds") == tree_bytes(dataset)  # the same shards, byte for byte
    report, images, stderr = load(site, tmp_path / "wds", tmp_path)
    assert all(Path(report[k]).is_relative_to(site) for k in ("fastload", "turbo", "near_index")), report
    assert report["decoder"] == "fastload.decode._turbo" and "Warning" not in stderr, (report, stderr)
    assert images.shape == (30, 3, 32, 32)
    assert np.array_equal(images, checkout_images(dataset))  # the same crops, pixel for pixel

    # every command on the declared dependencies alone: convert (both layouts), inspect, verify, load, bench
    demo = run(fastload_command, "demo", "--workdir", tmp_path / "demo", "--images", "24", cwd=tmp_path)
    assert "24 samples verified and decoded: OK" in demo.stdout and "fastload-cpu" in demo.stdout, demo.stdout


def test_extension_that_does_not_load_warns_once_and_falls_back(bundled: tuple[Path, Path], dataset: Path, tmp_path: Path) -> None:
    site = venv_with(*bundled, tmp_path / "venv")
    only(sorted((site / "fastload.libs").glob("libjpeg-*"))).unlink()  # the bundled libjpeg is gone
    report, images, stderr = load(site, dataset, tmp_path)
    assert report["decoder"] == "simplejpeg" and report["turbo"] is None, report
    assert stderr.count("RuntimeWarning: fastload: the libjpeg-turbo extension") == 1, stderr  # main process only
    assert re.search(r"_turbo\S*\.so is installed but does not load \(ImportError: libjpeg-[0-9a-f]{8}\.so", stderr), stderr
    turbo = checkout_images(dataset)
    assert images.shape == turbo.shape and not np.array_equal(images, turbo)  # decoded another way...
    assert np.abs(images.astype(int) - turbo).mean() < 3  # ...to the same images


def test_source_build_without_a_compiler_says_so_and_works(bundled: tuple[Path, Path], dataset: Path, tmp_path: Path) -> None:
    wheel, output = build_plain(tmp_path / "dist", cwd=tmp_path, CC="false")  # no C compiler
    assert EXTENSION_NOTE in output and NEAR_INDEX_NOTE in output, output[-4000:]
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if "/_turbo" in n or "/_index" in n]
    site = venv_with(wheel, bundled[1], tmp_path / "venv")
    report, images, stderr = load(site, dataset, tmp_path)
    assert report["decoder"] == "simplejpeg" and report["near_index"] is None and "Warning" not in stderr, (report, stderr)  # built without: no warning
    assert images.shape == (30, 3, 32, 32)

"""Every converter source reads only inside its source root: a file reached through a link that
leaves the root is refused by name unless ``--follow-symlinks``, and a manifest path climbing out
with ``..`` or absolute unless ``--allow-root`` names a folder holding it. The root's sibling ``src-private`` starts with the root's name: paths are
compared part by part, never as strings, so a link into it is refused like any other."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fastload.converters import ConvertOptions, convert
from fastload.converters.sources import SourceOptions, open_source
from fastload.errors import SampleError
from tests.conftest import jpeg_bytes, photo_folder, run_cli, small_photo


def link_out(src: Path, name: str) -> Path:
    """Move ``src/name`` into the sibling ``src-private`` and leave a symlink to it in its place."""
    private = src.parent / "src-private" / name
    private.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(src / name, private)
    (src / name).symlink_to(private)
    return src / name


def cifar(tmp: Path, fixtures: dict) -> tuple[Path, str]:
    src = tmp / "src"
    shutil.copytree(fixtures["cifar10_dir"], src)
    return src, str(link_out(src, "data_batch_3"))


def mnist(tmp: Path, fixtures: dict) -> tuple[Path, str]:
    src = tmp / "src"
    shutil.copytree(fixtures["mnist_dir"], src)
    name = next(p.name for p in src.iterdir() if p.name.startswith("train-labels"))
    return src, str(link_out(src, name))


def npz(tmp: Path, fixtures: dict) -> tuple[Path, str]:
    src = tmp / "src"
    src.mkdir()
    with np.load(fixtures["npz_file"]) as archive:
        np.save(src / "images.npy", archive["images"])
        np.save(src / "labels.npy", archive["labels"])
    return src, str(link_out(src, "labels.npy"))


def parquet(tmp: Path, fixtures: dict) -> tuple[Path, str]:
    src = tmp / "src"
    shutil.copytree(fixtures["parquet_dir"], src)
    return src, str(link_out(src, sorted(p.name for p in src.glob("*.parquet"))[1]))


def wds(tmp: Path, fixtures: dict) -> tuple[Path, str]:
    src = tmp / "src"
    shutil.copytree(fixtures["clean"], src)
    (src / "index.json").unlink()
    return src, str(link_out(src, "shard-00002.tar"))


def imagefolder_file(tmp: Path, fixtures: dict) -> tuple[Path, str]:
    src = photo_folder(tmp / "src", 6, (24, 32))
    return src, str(link_out(src, "c1/0004.jpg"))


def imagefolder_folder(tmp: Path, fixtures: dict) -> tuple[Path, str]:
    src = photo_folder(tmp / "src", 6, (24, 32))
    return src, str(link_out(src, "c2"))


SOURCES: dict[str, tuple[str, Callable[[Path, dict], tuple[Path, str]]]] = {
    "cifar": ("cifar", cifar), "mnist": ("mnist", mnist), "npz folder": ("npz", npz), "parquet folder": ("parquet", parquet),
    "wds folder": ("wds", wds), "imagefolder file": ("imagefolder", imagefolder_file), "imagefolder folder": ("imagefolder", imagefolder_folder),
}


@pytest.mark.parametrize("case", SOURCES)
def test_every_source_refuses_a_link_into_the_sibling_named_like_its_root(case: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    source, build = SOURCES[case]
    if source == "parquet":
        pytest.importorskip("pyarrow")
    fixtures = {name: request.getfixturevalue(name) for name in ("cifar10_dir", "mnist_dir", "npz_file", "clean")}
    fixtures["parquet_dir"] = request.getfixturevalue("parquet_dir") if source == "parquet" else None
    src, link = build(tmp_path, fixtures)
    with pytest.raises((ValueError, SampleError)) as refused:
        convert(str(src), str(tmp_path / "refused"), ConvertOptions(source=source))
    assert link in str(refused.value) and "the source root" in str(refused.value) and "--follow-symlinks" in str(refused.value)
    assert not (tmp_path / "refused" / "index.json").exists()
    followed = ConvertOptions(source=source, source_options=SourceOptions(follow_symlinks=True))
    assert convert(str(src), str(tmp_path / "followed"), followed).index.num_samples > 0


def test_a_manifest_reads_only_inside_its_folder_unless_asked(tmp_path: Path) -> None:
    """Rows climbing out with ``..``, an absolute path, and a link into ``src-private``: refused by
    row (skipped and reported with --on-error skip); the link read with --follow-symlinks, all
    three with --allow-root src-private (the folder they lie in)."""
    src, private = tmp_path / "src", tmp_path / "src-private"
    (src / "images").mkdir(parents=True)
    private.mkdir()
    for i in range(4):
        (src / "images" / f"in{i}.jpg").write_bytes(jpeg_bytes(small_photo(i)))
    for name in ("up.jpg", "absolute.jpg", "linked.jpg"):
        (private / name).write_bytes(jpeg_bytes(small_photo(len(name))))
    (src / "images" / "linked.jpg").symlink_to(private / "linked.jpg")
    rows = [*(f"images/in{i}.jpg" for i in range(4)), "../src-private/up.jpg", str(private / "absolute.jpg"), "images/linked.jpg"]
    (src / "list.jsonl").write_text("".join(json.dumps({"path": p, "label": i % 2}) + "\n" for i, p in enumerate(rows)))
    refused = run_cli("convert", str(src / "list.jsonl"), str(tmp_path / "o1"), "--from", "manifest", "--quiet", check=False)
    assert refused.returncode == 2 and "up.jpg (row 5 of list.jsonl): outside the manifest's folder" in refused.stderr
    assert "pass --allow-root DIR" in refused.stderr and len(refused.stderr.splitlines()) == 1
    run_cli("convert", str(src / "list.jsonl"), str(tmp_path / "o2"), "--from", "manifest", "--on-error", "skip", "--quiet")
    skipped = [json.loads(line) for line in (tmp_path / "o2" / "skipped.jsonl").read_text().splitlines()]
    assert sorted(Path(e["where"].split(" (row")[0]).name for e in skipped) == ["absolute.jpg", "linked.jpg", "up.jpg"]
    assert "a link leading outside the manifest's folder" in next(e["reason"] for e in skipped if "linked.jpg" in e["where"])
    assert json.loads((tmp_path / "o2" / "index.json").read_text())["num_samples"] == 4
    run_cli("convert", str(src / "list.jsonl"), str(tmp_path / "o3"), "--from", "manifest", "--follow-symlinks", "--on-error", "skip", "--quiet")
    assert json.loads((tmp_path / "o3" / "index.json").read_text())["num_samples"] == 5  # the link's; the rows spelled outside need --allow-root
    run_cli("convert", str(src / "list.jsonl"), str(tmp_path / "o4"), "--from", "manifest", "--allow-root", str(private), "--quiet")
    assert json.loads((tmp_path / "o4" / "index.json").read_text())["num_samples"] == 7
    assert os.path.islink(src / "images" / "linked.jpg")  # read through, never altered


def test_a_manifest_does_not_look_at_files_outside_its_folder(tmp_path: Path) -> None:
    """Listing the rows (for resume stamps and size hints) takes no stat of a file outside the
    folder unless --allow-root names its folder: its size and time never reach the conversion's records."""
    src, private = tmp_path / "src", tmp_path / "private"
    src.mkdir()
    private.mkdir()
    (src / "in.jpg").write_bytes(jpeg_bytes(small_photo(0)))
    (private / "out.jpg").write_bytes(jpeg_bytes(small_photo(1)))
    (src / "list.jsonl").write_text("".join(json.dumps({"path": p, "label": 0}) + "\n" for p in ("in.jpg", "../private/out.jpg")))

    def listed(follow: bool) -> list[tuple[int, tuple[int, ...]]]:
        source = open_source("manifest", str(src / "list.jsonl"), SourceOptions(allowed_roots=(str(private),) if follow else ()))
        return [(item.size_hint, item.stamp) for item in source.items()]

    confined, followed = listed(False), listed(True)
    manifest_stamp = confined[1][1]
    assert confined[0][0] == (src / "in.jpg").stat().st_size and len(confined[0][1]) == len(manifest_stamp) + 2
    assert confined[1][0] == 0 and len(manifest_stamp) == 2  # the manifest's own (size, mtime) only
    assert followed[1][0] == (private / "out.jpg").stat().st_size and len(followed[1][1]) == 4
    (private / "out.jpg").write_bytes(b"changed")
    assert listed(False)[1] == confined[1] and listed(True)[1] != followed[1]


def test_a_csv_of_absolute_paths_reads_from_the_folders_allow_root_names(tmp_path: Path) -> None:
    """The usual manifest: a CSV of absolute paths to images kept elsewhere. It needed
    --follow-symlinks, a flag named for links; now --allow-root DIR (repeatable) names the folders
    its rows may read from, the refusal says so, and a link leading out of them still needs --follow-symlinks."""
    images, more, elsewhere, out = tmp_path / "images", tmp_path / "more", tmp_path / "elsewhere", tmp_path / "out"
    for folder in (images, more, elsewhere, out):
        folder.mkdir()
    for i in range(3):
        (images / f"a{i}.jpg").write_bytes(jpeg_bytes(small_photo(i)))
    (more / "b.jpg").write_bytes(jpeg_bytes(small_photo(7)))
    (elsewhere / "c.jpg").write_bytes(jpeg_bytes(small_photo(8)))
    (more / "linked.jpg").symlink_to(elsewhere / "c.jpg")
    rows = [*(images / f"a{i}.jpg" for i in range(3)), more / "b.jpg"]
    (out / "train.csv").write_text("path,label\n" + "".join(f"{path},{i % 2}\n" for i, path in enumerate(rows)))
    convert_csv = ["convert", str(out / "train.csv"), "--from", "manifest", "--quiet"]
    refused = run_cli(*convert_csv, str(tmp_path / "o1"), check=False)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert f"{images / 'a0.jpg'} (row 1 of train.csv): outside the manifest's folder" in refused.stderr
    assert "pass --allow-root DIR (a folder the manifest may read from)" in refused.stderr
    refused = run_cli(*convert_csv, str(tmp_path / "o2"), "--allow-root", str(images), check=False)
    assert refused.returncode == 2 and "b.jpg (row 4 of train.csv): outside the manifest's folder and the --allow-root folders" in refused.stderr
    run_cli(*convert_csv, str(tmp_path / "o3"), "--allow-root", str(images), "--allow-root", str(more))
    assert json.loads((tmp_path / "o3" / "index.json").read_text())["num_samples"] == 4
    (out / "train.csv").write_text((out / "train.csv").read_text() + f"{more / 'linked.jpg'},1\n")
    refused = run_cli(*convert_csv, str(tmp_path / "o4"), "--allow-root", str(images), "--allow-root", str(more), check=False)
    assert refused.returncode == 2 and "linked.jpg (row 5 of train.csv): a link leading outside the manifest's folder and the --allow-root folders" in refused.stderr
    assert "pass --follow-symlinks to read it" in refused.stderr
    run_cli(*convert_csv, str(tmp_path / "o5"), "--allow-root", str(images), "--allow-root", str(more), "--follow-symlinks")
    assert json.loads((tmp_path / "o5" / "index.json").read_text())["num_samples"] == 5
    refused = run_cli(*convert_csv, str(tmp_path / "o6"), "--allow-root", str(tmp_path / "missing"), check=False)
    assert refused.returncode == 2 and f"--allow-root {tmp_path / 'missing'}: not a folder" in refused.stderr

"""Manifest label columns: numbers are class indices (integral floats too), names become sorted
classes, an empty cell is no label, a column mixing numbers and names is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fastload
from fastload.converters import ConvertOptions, convert
from tests.conftest import jpeg_bytes, run_cli, small_photo


def write_manifest(root: Path, labels: list[str], name: str = "list.csv") -> Path:
    """A CSV manifest (``path,label``) over one small JPEG per label, written under ``root``."""
    (root / "img").mkdir(parents=True)
    for i in range(len(labels)):
        (root / "img" / f"{i}.jpg").write_bytes(jpeg_bytes(small_photo(i)))
    manifest = root / name
    manifest.write_text("path,label\n" + "".join(f"img/{i}.jpg,{label}\n" for i, label in enumerate(labels)))
    return manifest


def stored_labels(out: Path) -> list[int]:
    """Every sample's label as the converted dataset holds it (-1: none)."""
    return [int(v) for v in fastload.open(str(out)).sample_labels()]


@pytest.mark.parametrize("layout", ["wds", "hdf5"])
def test_integer_labels_with_an_empty_cell_stay_integers(tmp_path: Path, layout: str) -> None:
    manifest = write_manifest(tmp_path / "src", ["2", "10", "2", ""])
    index = convert(str(manifest), str(tmp_path / "out"), ConvertOptions(source="manifest", layout=layout), quiet=True).index
    assert index.classes is None
    assert stored_labels(tmp_path / "out") == [2, 10, 2, -1]
    assert index.class_counts == {"2": 2, "10": 1}


def test_a_float_export_is_the_integers_it_spells(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "src", [f"{i}.0" for i in range(11)])
    index = convert(str(manifest), str(tmp_path / "out"), ConvertOptions(source="manifest"), quiet=True).index
    assert index.classes is None
    assert stored_labels(tmp_path / "out") == list(range(11))


def test_jsonl_float_and_null_labels(tmp_path: Path) -> None:
    write_manifest(tmp_path, ["x"] * 4)
    manifest = tmp_path / "list.jsonl"
    labels = [3.0, None, 0, "1"]
    manifest.write_text("".join(json.dumps({"path": f"img/{i}.jpg", "label": v}) + "\n" for i, v in enumerate(labels)))
    convert(str(manifest), str(tmp_path / "out"), ConvertOptions(source="manifest"), quiet=True)
    assert stored_labels(tmp_path / "out") == [3, -1, 0, 1]


def test_class_names_with_an_empty_cell_make_no_empty_class(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "src", ["dog", "", "cat", "dog"])
    index = convert(str(manifest), str(tmp_path / "out"), ConvertOptions(source="manifest"), quiet=True).index
    assert index.classes == ("cat", "dog")
    assert stored_labels(tmp_path / "out") == [1, -1, 0, 1]
    assert index.class_counts == {"cat": 1, "dog": 2}


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (["2", "10", "cat", "3"], r"list\.csv: column 'label' mixes numbers and class names: row 1's label is a number, row 3's is a class name"),
        (["", "cat", "dog", "4.0"], r"list\.csv: column 'label' mixes numbers and class names: row 2's label is a class name, row 4's is a number"),
        (["1", "2.5"], r"list\.csv: row 2's label in column 'label' is not a whole number"),
    ],
)
def test_a_label_column_that_is_neither_numbers_nor_names_is_refused(tmp_path: Path, labels: list[str], message: str) -> None:
    manifest = write_manifest(tmp_path / "src", labels)
    with pytest.raises(ValueError, match=message):
        convert(str(manifest), str(tmp_path / "out"), ConvertOptions(source="manifest"), quiet=True)
    assert not (tmp_path / "out" / "index.json").exists()


def test_the_cli_names_the_manifest_and_row(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "src", ["0", "1", "bird"])
    result = run_cli("convert", str(manifest), str(tmp_path / "out"), "--from", "manifest", check=False)
    assert result.returncode == 2
    assert "list.csv: column 'label' mixes numbers and class names" in result.stderr
    assert "row 3's is a class name" in result.stderr

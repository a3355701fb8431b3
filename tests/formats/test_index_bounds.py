"""The edges of what a dataset's index and ``.idx`` files may say, each checked on both sides (the
mutation pass of index.py, formats/idx.py and files.py found these unpinned): the int64 limit,
the readable versions, a shard's required checksum, a member that ends exactly at the end of its
shard or is empty, member names whose key ends at a dot, and the field-name limit."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload.errors import DatasetIndexError
from fastload.formats.idx import format_dali_index, parse_dali_index, split_member_name
from fastload.formats.index import INDEX_FILE, DatasetIndex, read_index

INT64_MAX = 2**63 - 1


@pytest.fixture()
def ds_root(clean: Path, tmp_path: Path) -> Path:
    """A private copy of the 30-sample, 4-shard tar dataset."""
    root = tmp_path / "ds"
    shutil.copytree(clean, root)
    return root


def rewrite_index(root: Path, **top: object) -> dict:
    """ROOT/index.json with ``top`` set (shard changes as ``shard1={...}``); returns the JSON written."""
    data = json.loads((root / INDEX_FILE).read_text())
    for key, value in top.items():
        if key.startswith("shard"):
            data["shards"][int(key[5:])].update(value)
        else:
            data[key] = value
    data.pop("num_samples", None)
    (root / INDEX_FILE).write_text(json.dumps(data))
    return data


# --- index.json ------------------------------------------------------------------------------------

def test_counts_up_to_int64_max_are_read_and_one_more_is_refused(ds_root: Path) -> None:
    rewrite_index(ds_root, shard1={"samples": INT64_MAX - 22, "bytes": INT64_MAX}, duplicates=INT64_MAX)
    index = read_index(ds_root)
    assert (index.num_samples, index.shards[1].bytes, index.duplicates) == (INT64_MAX, INT64_MAX, INT64_MAX)
    for change in ({"shard1": {"bytes": INT64_MAX + 1}}, {"duplicates": INT64_MAX + 1}, {"shard2": {"samples": INT64_MAX + 1}}):
        shutil.copy(ds_root / INDEX_FILE, ds_root / "saved.json")
        rewrite_index(ds_root, **change)
        with pytest.raises(DatasetIndexError, match=re.escape("must be an integer from 0 to 2**63 - 1")):
            read_index(ds_root)
        shutil.copy(ds_root / "saved.json", ds_root / INDEX_FILE)


def test_samples_summing_past_int64_max_are_refused(ds_root: Path) -> None:
    rewrite_index(ds_root, shard1={"samples": INT64_MAX - 21})  # the other shards hold 22
    with pytest.raises(DatasetIndexError, match=re.escape("shards: more than 2**63 - 1 samples in all")):
        read_index(ds_root)


def test_versions_one_to_four_are_read_and_later_ones_refused(ds_root: Path) -> None:
    for version in (1, 2, 3):
        rewrite_index(ds_root, version=version)
        assert read_index(ds_root).version == version
        assert len(fastload.open(ds_root)) == 30
    rewrite_index(ds_root, version=4)  # the version of video datasets: it lists a video field
    with pytest.raises(DatasetIndexError, match=re.escape("fields: a video or audio dataset (version 4) lists no video or audio field")):
        read_index(ds_root)
    rewrite_index(ds_root, version=4, fields=["cls", "jpg", "mp4"])
    assert read_index(ds_root).version == 4
    rewrite_index(ds_root, version=5)  # the version of token datasets
    with pytest.raises(DatasetIndexError, match=re.escape("version: a non-token dataset is of version 1 to 4")):
        read_index(ds_root)
    rewrite_index(ds_root, version=6)  # the version of data read in place (Parquet row groups)
    with pytest.raises(DatasetIndexError, match=re.escape("version: only data read in place is of version 6")):
        read_index(ds_root)
    rewrite_index(ds_root, version=6, layout="parquet")  # its shards must be row groups
    with pytest.raises(DatasetIndexError, match=re.escape("shards[0].row_group: missing")):
        read_index(ds_root)
    rewrite_index(ds_root, version=7)
    with pytest.raises(DatasetIndexError, match=re.escape("index version 7 is not supported (this fastload reads (1, 2, 3, 4, 5, 6))")):
        read_index(ds_root)


def test_a_shard_without_its_checksum_is_refused(ds_root: Path) -> None:
    """offsets_sha256 may be null (no .idx, or one fetched unchecked); a shard's own sha256 may not."""
    rewrite_index(ds_root, shard1={"offsets_sha256": None})
    assert read_index(ds_root).shards[1].offsets_sha256 is None
    rewrite_index(ds_root, shard1={"sha256": None})
    with pytest.raises(DatasetIndexError, match=re.escape("shards[1].sha256: must be a sha256 digest")):
        read_index(ds_root)


# --- the .idx of a tar shard ------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("name", "key", "ext"),
    [
        ("a.b/c.jpg", "a.b/c", "jpg"),  # a dot in a folder name is not the key's end
        ("ab./c.jpg", "ab./c", "jpg"),
        ("d/x.y.jpg", "d/x", "y.jpg"),
        ("abc.jpg", "abc", "jpg"),
        ("d/.jpg", "d/", "jpg"),  # an empty last part before the dot
        (".jpg", "", "jpg"),
    ],
)
def test_a_key_ends_at_the_first_dot_of_the_last_path_part(name: str, key: str, ext: str) -> None:
    assert split_member_name(name) == (key, ext)  # as `fastload index` and the WebDataset source split them
    members = parse_dali_index(format_dali_index([[(ext, 512, 1, name)]]).decode(), "s.idx")
    assert members.key(0) == key
    assert members.members() == [(name, 512, 1)]


def test_a_member_name_without_a_dot_is_all_key() -> None:
    assert split_member_name("d.x/noext") == ("d.x/noext", "")


def test_up_to_65535_field_names_fit_and_one_more_is_refused() -> None:
    limit = np.iinfo(np.uint16).max
    samples = [[(f"f{i}", 512 * i, 1, f"k{i}.f{i}")] for i in range(limit)]
    members = parse_dali_index(format_dali_index(samples).decode(), "s.idx")
    assert members.spans(limit - 1) == {f"f{limit - 1}": (512 * (limit - 1), 1)}
    samples.append([(f"f{limit}", 0, 1, f"k{limit}.f{limit}")])
    with pytest.raises(DatasetIndexError, match=re.escape(f"s.idx: more than {limit} different field names")):
        parse_dali_index(format_dali_index(samples).decode(), "s.idx")


def test_optional_fields_left_out_read_as_their_defaults(ds_root: Path) -> None:
    """An index written before a field existed (or by another writer) leaves it out."""
    data = json.loads((ds_root / INDEX_FILE).read_text())
    for name in ("classes", "class_counts", "image_fields", "decoded_shape", "skipped", "duplicates", "source", "conversion", "num_samples"):
        data.pop(name, None)
    for shard in data["shards"]:
        shard.pop("offsets_sha256")
    (ds_root / INDEX_FILE).write_text(json.dumps(data))
    index = read_index(ds_root)
    assert (index.classes, index.class_counts, index.image_fields, index.decoded_shape) == (None, {}, (), None)
    assert (index.skipped, index.duplicates, index.source, index.conversion) == ({}, 0, "", {})
    assert index.num_samples == 30 and all(s.offsets_sha256 is None for s in index.shards)


def test_an_index_built_in_code_checks_its_shards_too(ds_root: Path) -> None:
    shards = read_index(ds_root).shards
    assert DatasetIndex(layout="wds", shards=shards, fields=("jpg", "cls")).num_samples == 30
    for bad in (list(shards), (*shards, {"path": "x.tar"})):
        with pytest.raises(DatasetIndexError, match="shards: must be a list of shards"):
            DatasetIndex(layout="wds", shards=bad, fields=("jpg", "cls"))  # type: ignore[arg-type]


def test_a_decoded_side_of_one_pixel_is_read_and_zero_is_refused(ds_root: Path) -> None:
    rewrite_index(ds_root, layout="hdf5", decoded_shape=[1, 1, 1])
    assert read_index(ds_root).decoded_shape == (1, 1, 1)
    rewrite_index(ds_root, decoded_shape=[1, 0, 1])
    with pytest.raises(DatasetIndexError, match=re.escape("decoded_shape: must be an integer from 1 to 2**63 - 1")):
        read_index(ds_root)


def test_the_index_is_written_with_sorted_keys(clean: Path) -> None:
    """Reruns are byte-identical: every object's keys in sorted order, whatever the field order."""
    text = (clean / INDEX_FILE).read_text()
    assert text == read_index(clean).to_json()
    pairs: list[list[str]] = []
    json.loads(text, object_pairs_hook=lambda items: pairs.append([k for k, _ in items]) or dict(items))
    assert len(pairs) > 5 and all(keys == sorted(keys) for keys in pairs)

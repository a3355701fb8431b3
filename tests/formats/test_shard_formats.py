"""One way to add a shard layout: its row in fastload.formats.shard_formats, a writer of that
name, and converted shards that carry its suffix and the files the row says lie beside them."""

from __future__ import annotations

from pathlib import Path

import pytest

import fastload
from fastload.converters import ConvertOptions, convert
from fastload.formats.shard_files import offsets_name
from fastload.formats.shard_formats import LAYOUTS, SHARD_FORMATS, WRITTEN_LAYOUTS


def test_every_layout_is_a_folder_with_its_reader_writer_and_readme() -> None:
    """A layout's row names its writer, which lies in the layout's folder beside its reader and a README."""
    import importlib

    for layout in WRITTEN_LAYOUTS:
        writer = importlib.import_module(SHARD_FORMATS[layout].writer)
        folder = Path(writer.__file__).parent
        assert writer.__name__ == f"fastload.formats.{layout}.writer" and callable(writer.open_writer)
        assert (folder / "reader.py").is_file() and (folder / "README.md").is_file()
    for layout in set(LAYOUTS) - set(WRITTEN_LAYOUTS):  # read in place: written by others, a reader and a README
        folder = Path(fastload.__file__).parent / "formats" / layout
        assert SHARD_FORMATS[layout].in_place and (folder / "reader.py").is_file() and (folder / "README.md").is_file()


@pytest.mark.parametrize("layout", [layout for layout in WRITTEN_LAYOUTS if not SHARD_FORMATS[layout].holds_tokens])  # tokens: tests/text
def test_shards_are_as_their_row_says(image_folder: Path, tmp_path: Path, layout: str) -> None:
    convert(str(image_folder), str(tmp_path), ConvertOptions(source="imagefolder", layout=layout, samples_per_shard=5), quiet=True)
    ds = fastload.open(tmp_path)
    row = SHARD_FORMATS[layout]
    assert ds.layout is row
    for shard in ds.index.shards:
        assert shard.path.endswith(row.suffix)
        assert (tmp_path / offsets_name(shard)).exists() == row.offsets_beside
    assert len(ds) == sum(1 for _ in map(ds.raw, range(len(ds))))

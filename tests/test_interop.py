"""Other readers see exactly the converted samples: the webdataset library, DALI's webdataset
reader on the CPU (with our .idx files), and plain h5py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastload.converters import ConvertOptions, WriterOptions, convert
from fastload.formats.index import read_index


def expected_samples(image_folder: Path) -> dict[str, tuple[bytes, int]]:
    classes = sorted(p.name for p in image_folder.iterdir())
    return {
        p.relative_to(image_folder).with_suffix("").as_posix(): (p.read_bytes(), classes.index(p.parent.name))
        for p in sorted(image_folder.rglob("*.jpg"))
    }


@pytest.fixture(scope="module")
def wds_out(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wds")
    convert(str(image_folder), str(out), ConvertOptions(source="imagefolder", samples_per_shard=8, shuffle=True, seed=5))
    return out


def test_webdataset_library_reads_every_sample(image_folder: Path, wds_out: Path) -> None:
    import webdataset as wds

    index = read_index(wds_out)
    urls = [str(wds_out / s.path) for s in index.shards]
    got = {s["__key__"]: (s["jpg"], int(s["cls"])) for s in wds.WebDataset(urls, shardshuffle=False)}
    assert got == expected_samples(image_folder)


def test_dali_webdataset_reader_with_our_idx_files(image_folder: Path, wds_out: Path) -> None:
    dali = pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn

    index = read_index(wds_out)
    paths = [str(wds_out / s.path) for s in index.shards]
    idx = [str(wds_out / s.offsets) for s in index.shards]

    @dali.pipeline_def(batch_size=index.num_samples, num_threads=1, device_id=None)
    def pipe():  # type: ignore[no-untyped-def]
        jpg, cls = fn.readers.webdataset(paths=paths, index_paths=idx, ext=["jpg", "cls"], missing_component_behavior="error")
        return jpg, cls, fn.decoders.image(jpg, device="cpu")

    p = pipe()
    p.build()
    jpgs, labels, images = p.run()
    got = [(bytes(np.array(jpgs.at(i))), int(bytes(np.array(labels.at(i))))) for i in range(index.num_samples)]
    expected = expected_samples(image_folder)
    assert sorted(got) == sorted(expected.values())
    assert all(images.at(i).shape[2] == 3 for i in range(index.num_samples))


def test_h5py_reads_encoded_and_decoded_hdf5(image_folder: Path, npz_file: Path, tmp_path: Path) -> None:
    import h5py

    convert(str(image_folder), str(tmp_path / "enc"), ConvertOptions(source="imagefolder", layout="hdf5"))
    index = read_index(tmp_path / "enc")
    with h5py.File(tmp_path / "enc" / index.shards[0].path) as f:
        keys = [k.decode() for k in f["key"][:]]
        images, offsets = f["image/bytes"], f["image/offsets"]  # flat: value i = bytes[offsets[i]:offsets[i + 1]]
        got = {k: (images[offsets[i] : offsets[i + 1]].tobytes(), int(f["cls"][i])) for i, k in enumerate(keys)}
        assert f.attrs["format"] == "fastload"
    assert got == expected_samples(image_folder)

    options = ConvertOptions(source="npz", layout="hdf5", writer_options=WriterOptions(hdf5_decoded=True, hdf5_compression="gzip"))
    convert(str(npz_file), str(tmp_path / "dec"), options)
    with h5py.File(tmp_path / "dec" / "shard-00000.h5") as f, np.load(npz_file) as data:
        assert f["pixels"].compression == "gzip"
        assert np.array_equal(f["pixels"][:], data["images"])
        assert np.array_equal(f["cls"][:], data["labels"])

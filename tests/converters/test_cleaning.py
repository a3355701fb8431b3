"""Bad input is reported with its reason (or stops the run naming the file); unusual but valid
images convert correctly; symlinks and unsafe tar names are refused."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastload.converters import ConvertOptions, SourceOptions, convert
from fastload.decode.cpu import decode_image
from fastload.errors import SampleError
from fastload.formats.index import read_index
from fastload.formats.shard_files import open_shard
from tests.conftest import jpeg_bytes, png_bytes, run_cli, small_photo
from tests.hostile_data import fake_png_header


@pytest.fixture()
def messy_folder(tmp_path: Path) -> Path:
    """Good images, four kinds of bad file, and unusual-but-valid images, in one image folder."""
    root = tmp_path / "messy"
    good, odd = root / "good", root / "odd"
    good.mkdir(parents=True)
    odd.mkdir()
    for i in range(5):
        (good / f"ok_{i}.jpg").write_bytes(jpeg_bytes(small_photo(i)))
    whole = jpeg_bytes(small_photo(99, size=(120, 160)))
    (good / "bad_truncated.jpg").write_bytes(whole[: len(whole) // 2])
    (good / "bad_empty.jpg").write_bytes(b"")
    (good / "bad_text.jpg").write_bytes(b"this is not an image, just text named .jpg\n")
    (good / "bad_bomb.png").write_bytes(fake_png_header(100_000, 100_000))
    photo = small_photo(7, size=(40, 56))
    (odd / "png_named.jpg").write_bytes(png_bytes(photo))
    (odd / "cmyk.jpg").write_bytes(jpeg_bytes(photo.convert("CMYK")))
    (odd / "gray.jpg").write_bytes(jpeg_bytes(photo.convert("L")))
    (odd / "rgba.png").write_bytes(png_bytes(photo.convert("RGBA")))
    sixteen = Image.fromarray((np.arange(40 * 56, dtype=np.uint16).reshape(40, 56) * 29).astype(np.uint16))
    (odd / "gray16.png").write_bytes(png_bytes(sixteen))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 CW to display
    (odd / "exif_rotated.jpg").write_bytes(jpeg_bytes(photo, exif=exif.tobytes()))
    return root


BAD = {"good/bad_truncated", "good/bad_empty", "good/bad_text", "good/bad_bomb"}


def test_raise_names_the_bad_file(messy_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(SampleError, match=r"bad_bomb\.png: decompression bomb"):
        convert(str(messy_folder), str(tmp_path / "out"), ConvertOptions(source="imagefolder"))
    assert not (tmp_path / "out" / "index.json").exists()


def test_skip_reports_each_bad_file_with_its_reason(messy_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    index = convert(str(messy_folder), str(out), ConvertOptions(source="imagefolder", on_error="skip")).index
    assert index.num_samples == 11
    report = {json.loads(line)["key"]: json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()}
    assert set(report) == BAD
    assert report["good/bad_truncated"]["reason"].startswith("truncated jpg")
    assert report["good/bad_empty"]["reason"].startswith("empty file")
    assert report["good/bad_text"]["reason"].startswith("not an image")
    assert report["good/bad_bomb"]["reason"].startswith("decompression bomb: 100000x100000")
    assert report["good/bad_text"]["where"].endswith("good/bad_text.jpg")
    assert index.skipped == {"decompression bomb": 1, "empty file": 1, "not an image": 1, "truncated jpg": 1}
    inspected = json.loads(run_cli("inspect", str(out), "--json").stdout)
    assert inspected["skipped_total"] == 4
    assert {e["key"] for e in inspected["skipped_samples"]} == BAD
    text = run_cli("inspect", str(out)).stdout
    assert "bad_truncated.jpg: truncated jpg" in text


def test_unusual_valid_images_convert_and_decode_like_pillow(messy_folder: Path, tmp_path: Path) -> None:
    """Field names follow content (a PNG named .jpg is stored as png); decoded pixels equal Pillow's
    RGB conversion without EXIF rotation (fastload, like torchvision, does not apply it)."""
    out = tmp_path / "out"
    convert(str(messy_folder), str(out), ConvertOptions(source="imagefolder", on_error="skip"))
    index = read_index(out)
    reader = open_shard(out, index, index.shards[0])
    fields = {reader.key(i): reader.read(i) for i in range(len(reader))}
    assert "png" in fields["odd/png_named"] and "jpg" not in fields["odd/png_named"]
    for key in ("odd/png_named", "odd/cmyk", "odd/gray", "odd/rgba", "odd/exif_rotated"):
        data = next(v for k, v in fields[key].items() if k != "cls")
        source = (messy_folder / key).with_suffix(".jpg" if "rgba" not in key else ".png")
        assert data == source.read_bytes()
        expected = np.asarray(Image.open(source).convert("RGB"))
        decoded = decode_image(data, key)
        assert decoded.shape == expected.shape == (40, 56, 3)
        assert np.abs(decoded.astype(int) - expected.astype(int)).max() <= 2, key
    gray16 = decode_image(fields["odd/gray16"]["png"], "gray16")
    raw = np.asarray(Image.open(messy_folder / "odd/gray16.png"), dtype=np.uint32)
    assert gray16.shape == (40, 56, 3) and np.array_equal(gray16[:, :, 0], (raw >> 8).astype(np.uint8))


def test_small_pixel_limit_is_configurable(tmp_path: Path) -> None:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    (src / "big.jpg").write_bytes(jpeg_bytes(small_photo(1, size=(100, 100))))
    with pytest.raises(SampleError, match="decompression bomb: 100x100"):
        convert(str(src.parent), str(tmp_path / "out"), ConvertOptions(source="imagefolder", max_pixels=5000))


def test_symlink_leaving_the_root_is_refused_unless_asked(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jpg"
    outside.write_bytes(jpeg_bytes(small_photo(3)))
    cls = tmp_path / "src" / "a"
    cls.mkdir(parents=True)
    (cls / "inside.jpg").write_bytes(jpeg_bytes(small_photo(4)))
    os.symlink(outside, cls / "link.jpg")
    with pytest.raises(SampleError, match="link.jpg: symlink leaves the source root"):
        convert(str(tmp_path / "src"), str(tmp_path / "o1"), ConvertOptions(source="imagefolder"))
    followed = ConvertOptions(source="imagefolder", source_options=SourceOptions(follow_symlinks=True))
    assert convert(str(tmp_path / "src"), str(tmp_path / "o2"), followed).index.num_samples == 2


def test_linked_folders_are_read_or_refused_never_left_out(tmp_path: Path) -> None:
    """A class folder linked from another disk is refused by name (dropping it would renumber the
    classes after it) unless --follow-symlinks, then read like torchvision's ImageFolder does; a
    folder linked within the root is read; a link back up to an ancestor is a loop, refused."""
    src = tmp_path / "src"
    for name, seed in (("ant", 1), ("cat", 2)):
        (src / name).mkdir(parents=True)
        (src / name / "0.jpg").write_bytes(jpeg_bytes(small_photo(seed)))
    (tmp_path / "elsewhere" / "bee").mkdir(parents=True)
    for n in range(2):
        (tmp_path / "elsewhere" / "bee" / f"{n}.jpg").write_bytes(jpeg_bytes(small_photo(10 + n)))
    os.symlink(tmp_path / "elsewhere" / "bee", src / "bee")
    (src / "cat" / "real").mkdir()
    (src / "cat" / "real" / "1.jpg").write_bytes(jpeg_bytes(small_photo(3)))
    os.symlink("real", src / "cat" / "also")  # within the root
    with pytest.raises(ValueError, match=r"src/bee: a folder linked from outside the source root .*--follow-symlinks"):
        convert(str(src), str(tmp_path / "o1"), ConvertOptions(source="imagefolder"))
    followed = ConvertOptions(source="imagefolder", source_options=SourceOptions(follow_symlinks=True))
    index = convert(str(src), str(tmp_path / "o2"), followed).index
    assert index.classes == ("ant", "bee", "cat") and index.class_counts == {"ant": 1, "bee": 2, "cat": 3}
    os.symlink("..", src / "ant" / "up")
    with pytest.raises(ValueError, match="symlink loop"):
        convert(str(src), str(tmp_path / "o3"), followed)


def test_max_size_refuses_to_shrink_an_image_whose_other_fields_are_drawn_in_its_pixels(tmp_path: Path) -> None:
    """A sample with a mask (seg.png) or boxes (boxes.json) beside its image: --max-size would
    leave them in the original frame, so it is refused naming them (skipped and reported with
    --on-error skip); a caption and metadata json are no obstacle, nor an image already small."""
    big, small = jpeg_bytes(small_photo(1, size=(200, 200))), jpeg_bytes(small_photo(2, size=(60, 60)))
    members = {
        "masked.jpg": big, "masked.seg.png": png_bytes(Image.new("L", (200, 200))),
        "boxed.jpg": big, "boxed.boxes.json": b"[[100, 100, 150, 150]]",
        "captioned.jpg": big, "captioned.txt": b"a photo", "captioned.json": b'{"url": "x"}',
        "small.jpg": small, "small.boxes.json": b"[[1, 1, 5, 5]]",
    }
    tar_path = tmp_path / "in" / "data.tar"
    tar_path.parent.mkdir()
    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(SampleError, match=r"masked.*--max-size 100 would shrink the image but not its fields seg.png"):
        convert(str(tar_path.parent), str(tmp_path / "o1"), ConvertOptions(source="wds", max_size=100))
    out = tmp_path / "o2"
    index = convert(str(tar_path.parent), str(out), ConvertOptions(source="wds", max_size=100, on_error="skip")).index
    assert index.num_samples == 2  # captioned (shrunk) and small (already within the size)
    reasons = {json.loads(line)["key"]: json.loads(line)["reason"] for line in (out / "skipped.jsonl").read_text().splitlines()}
    assert sorted(reasons) == ["boxed", "masked"] and "fields boxes.json" in reasons["boxed"]


def test_tar_members_with_dotdot_or_absolute_names_are_rejected(tmp_path: Path) -> None:
    data = jpeg_bytes(small_photo(5))
    tar_path = tmp_path / "in" / "evil.tar"
    tar_path.parent.mkdir()
    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name in ("good.jpg", "../escape.jpg", "/etc/abs.jpg"):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(SampleError, match=r"contains '\.\.'"):
        convert(str(tar_path.parent), str(tmp_path / "o1"), ConvertOptions(source="wds"))
    index = convert(str(tar_path.parent), str(tmp_path / "o2"), ConvertOptions(source="wds", on_error="skip")).index
    assert index.num_samples == 1
    reasons = [json.loads(line)["reason"] for line in (tmp_path / "o2" / "skipped.jsonl").read_text().splitlines()]
    assert any("'..'" in r for r in reasons) and any("absolute" in r for r in reasons)

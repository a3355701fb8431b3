"""Masks decoded at the crop (fastload.decode.mask, the C kernel) give exactly the class ids that
Pillow's whole decode and the nearest-neighbour crop give: every PNG row filter, every bit depth
it reads, boxes at the edges, upscaling, flips; damaged PNGs are SampleErrors naming the field;
through the loader every encoding of one mask gives the same batch."""

from __future__ import annotations

import importlib.util
import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fastload import transforms as T
from fastload.decode.cpu import turbo
from fastload.decode.mask import mask_into, read_png_mask
from fastload.errors import SampleError
from tests.conftest import jpeg_bytes, run_cli
from tests.test_fields import loader, write_tars

pytestmark = pytest.mark.skipif(turbo is None, reason="the C extension is not built")


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def filtered(row: bytes, prev: bytes, kind: int, bpp: int) -> bytes:
    """One row under PNG filter ``kind`` (the left neighbour is the pixel's ``bpp`` bytes before)."""
    out = bytearray()
    for i, x in enumerate(row):
        a, b, c = (row[i - bpp] if i >= bpp else 0), prev[i], (prev[i - bpp] if i >= bpp else 0)
        predictor = (0, a, b, (a + b) // 2, paeth(a, b, c))[kind]
        out.append((x - predictor) % 256)
    return bytes(out)


def packed(values: np.ndarray, depth: int) -> list[bytes]:
    """Each row of ``values`` packed at ``depth`` bits a pixel, most significant bits first."""
    if depth == 16:
        return [line.astype(">u2").tobytes() for line in values]
    rows = []
    for line in values:
        bits = np.unpackbits(line.astype(np.uint8)[:, None], axis=1)[:, 8 - depth :]
        rows.append(np.packbits(bits.reshape(-1)).tobytes())
    return rows


def png(values: np.ndarray, depth: int, colour: int, filters: list[int], level: int = 6) -> bytes:
    """A PNG of ``values`` written by hand: row ``y`` under filter ``filters[y % len(filters)]``."""
    height, width = values.shape
    rows, raw, prev = packed(values, depth), bytearray(), None
    for y, row in enumerate(rows):
        kind = filters[y % len(filters)]
        raw += bytes([kind]) + filtered(row, prev or bytes(len(row)), kind, 2 if depth == 16 else 1)
        prev = row
    body = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0))
    if colour == 3:
        body += chunk(b"PLTE", bytes(range(3 * 2**depth)) if depth < 8 else bytes(768))
    return b"\x89PNG\r\n\x1a\n" + body + chunk(b"IDAT", zlib.compress(bytes(raw), level)) + chunk(b"IEND", b"")


def reference(data: bytes, box: tuple[float, float, float, float], flip: bool, size: tuple[int, int]) -> np.ndarray:
    """Pillow's whole decode, then the nearest-neighbour crop the loader used before the kernel."""
    mask = np.asarray(Image.open(io.BytesIO(data)))
    mask = mask.astype(np.uint16 if mask.dtype == np.uint16 else np.uint8)
    out = np.empty(size, mask.dtype)
    T.nearest_into(mask, T.Plan(box=box, size=size, flip=flip), out)
    return out


KINDS = [(0, 8), (0, 1), (0, 16), (3, 1), (3, 2), (3, 4), (3, 8)]  # (PNG colour type, bit depth) the kernel reads


@pytest.mark.parametrize(("colour", "depth"), KINDS)
@pytest.mark.parametrize("filters", [[0], [1], [2], [3], [4], [0, 1, 2, 3, 4]])
def test_kernel_equals_pillow_and_nearest_crop(colour: int, depth: int, filters: list[int]) -> None:
    rng = np.random.default_rng(depth * 10 + colour + 100 * filters[0] + len(filters))
    height, width = int(rng.integers(5, 40)), int(rng.integers(5, 40))
    values = rng.integers(0, 2**depth, size=(height, width))
    values[height // 2 :, width // 3 :] = 2**depth - 1  # a region too, so filters see runs
    data = png(values, depth, colour, filters)
    mask = read_png_mask(data, "shard.tar:k", "seg.png")
    assert mask is not None and (mask.height, mask.width, mask.bit_depth) == (height, width, depth)
    boxes = [(0.0, 0.0, float(width), float(height)), (width - 1.5, height - 2.0, float(width), float(height))]
    for _ in range(12):
        x0, y0 = rng.uniform(-2, width * 0.8), rng.uniform(-2, height * 0.8)
        boxes.append((x0, y0, x0 + rng.uniform(0.5, width), y0 + rng.uniform(0.5, height)))
    for box in boxes:
        for flip in (False, True):
            size = (int(rng.integers(1, 50)), int(rng.integers(1, 50)))
            out = np.full(size, 77, np.uint16 if depth == 16 else np.uint8)
            mask_into(mask, box, flip, out, "shard.tar:k", "seg.png")
            np.testing.assert_array_equal(out, reference(data, box, flip, size), err_msg=f"box {box} flip {flip}")


def test_pillow_written_masks_equal_pillow_decoded() -> None:
    rng = np.random.default_rng(3)
    classes = (rng.integers(0, 6, size=(61, 47)) * (rng.random((61, 47)) < 0.3)).astype(np.uint8)
    for image in (Image.fromarray(classes, mode="L"), Image.fromarray(classes, mode="L").convert("P"),
                  Image.fromarray(classes > 2).convert("1")):
        for options in ({}, {"optimize": True}, {"compress_level": 1}, {"bits": 4} if image.mode == "P" else {}):
            buf = io.BytesIO()
            image.save(buf, format="PNG", **options)
            mask = read_png_mask(buf.getvalue(), "k", "seg.png")
            assert mask is not None, (image.mode, options)
            out = np.empty((30, 20), np.uint8)
            mask_into(mask, (3.25, 5.5, 40.0, 60.0), True, out, "k", "seg.png")
            np.testing.assert_array_equal(out, reference(buf.getvalue(), (3.25, 5.5, 40.0, 60.0), True, (30, 20)))


@pytest.mark.parametrize("inflater", ["zlib", "isal"])
def test_zlib_and_isal_inflate_to_the_same_masks(inflater: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Either inflater (ISA-L's when python-isal is installed, the default then; else zlib's) gives
    Pillow's class ids, and damaged image data is a SampleError naming the field with both."""
    import fastload.decode.mask as mask_module

    decompressobj = pytest.importorskip("isal.isal_zlib").decompressobj if inflater == "isal" else zlib.decompressobj
    monkeypatch.setattr(mask_module, "_decompressor", decompressobj)
    rng = np.random.default_rng(11)
    values = rng.integers(0, 4, size=(83, 57))
    values[30:, 20:] = 3
    for filters, depth, colour in (([0, 1, 2, 3, 4], 8, 0), ([4, 2], 1, 0), ([1, 3], 16, 0), ([2], 2, 3)):
        data = png(values % 2**depth if depth < 8 else values, depth, colour, filters)
        mask = read_png_mask(data, "k", "seg.png")
        assert mask is not None
        for box in ((0.0, 0.0, 57.0, 83.0), (10.5, 40.25, 50.0, 60.0), (-3.0, 70.0, 20.0, 90.0)):
            out = np.empty((31, 17), np.uint16 if depth == 16 else np.uint8)
            mask_into(mask, box, True, out, "k", "seg.png")
            np.testing.assert_array_equal(out, reference(data, box, True, (31, 17)))
    good = read_png_mask(png(values.astype(np.uint8), 8, 0, [1]), "k", "seg.png")
    assert good is not None
    broken = type(good)(good.width, good.height, good.bit_depth, good.data[:2] + bytes([good.data[2] ^ 0xFF]) + good.data[3:])
    with pytest.raises(SampleError, match="field seg.png: cannot decode mask"):
        mask_into(broken, (0.0, 0.0, 57.0, 83.0), False, np.empty((8, 8), np.uint8), "k", "seg.png")


def test_kinds_it_does_not_read_go_to_pillow() -> None:
    values = np.arange(12, dtype=np.uint8).reshape(3, 4) % 4
    assert read_png_mask(png(values, 2, 0, [0]), "k", "m") is None  # 2-bit grey: Pillow rescales it
    rgb = io.BytesIO()
    Image.new("RGB", (4, 3)).save(rgb, format="PNG")
    assert read_png_mask(rgb.getvalue(), "k", "m") is None
    assert read_png_mask(jpeg_bytes(Image.new("L", (4, 3))), "k", "m") is None


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: d[:-30], "truncated PNG"),
        (lambda d: d[:40] + bytes([d[40] ^ 0xFF]) + d[41:], "bad CRC"),
        (lambda d: d[:8] + chunk(b"IHDX", b"x" * 13) + d[33:], "no IHDR chunk first"),
    ],
)
def test_damaged_pngs_are_sample_errors_naming_the_field(damage, reason: str) -> None:
    data = png(np.zeros((20, 20), np.uint8), 8, 0, [0])
    with pytest.raises(SampleError, match=f"shard.tar:k.*field seg.png: .*{reason}"):
        mask = read_png_mask(damage(data), "shard.tar:k", "seg.png")
        mask_into(mask, (0, 0, 20, 20), False, np.empty((4, 4), np.uint8), "shard.tar:k", "seg.png")


def test_bad_filter_and_short_image_data_are_sample_errors() -> None:
    head = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 0, 0, 0, 0))
    bad_filter = b"".join(bytes([kind]) + bytes(8) for kind in (0, 0, 9, 0, 0, 0, 0, 0))
    short = bytes(9) * 2  # two rows of eight
    for raw, reason in ((bad_filter, "unknown row filter"), (short, "truncated image data")):
        mask = read_png_mask(head + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""), "k", "m")
        assert mask is not None
        with pytest.raises(SampleError, match=f"field m: cannot decode mask: {reason}"):
            mask_into(mask, (0.0, 0.0, 8.0, 8.0), False, np.empty((8, 8), np.uint8), "k", "m")


def interlaced(values: np.ndarray, depth: int = 8, colour: int = 0, palette: bytes = b"") -> bytes:
    """An Adam7-interlaced PNG of ``values`` (8-bit grey unless told; filter 0): the kind only Pillow reads."""
    raw = bytearray()
    for y0, x0, dy, dx in ((0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2), (1, 0, 2, 1)):
        sub = values[y0::dy, x0::dx]
        if sub.size:
            for line in packed(sub, depth):
                raw += b"\0" + line
    height, width = values.shape
    body = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 1))
    body += chunk(b"PLTE", palette) if palette else b""
    return b"\x89PNG\r\n\x1a\n" + body + chunk(b"IDAT", zlib.compress(bytes(raw))) + chunk(b"IEND", b"")


def test_every_encoding_of_one_mask_gives_the_same_batch(tmp_path: Path) -> None:
    """Through the loader: one image, its mask as 8-bit grey, 8- and 4-bit palette, Paeth rows,
    and interlaced (decoded whole by Pillow): the same class ids in every sample's batch row."""
    rng = np.random.default_rng(11)
    classes = np.zeros((52, 70), np.uint8)
    classes[10:40, 5:30], classes[20:, 45:] = 3, 9
    classes[rng.random(classes.shape) < 0.05] = 5
    image = jpeg_bytes(Image.fromarray(np.dstack([classes * 20] * 3)))
    encodings = [png(classes, 8, 0, [0]), png(classes, 8, 3, [4]), png(classes, 4, 3, [1, 2, 3, 4]), interlaced(classes)]
    samples = [{"__key__": f"m{i}", "jpg": image, "seg.png": data} for i, data in enumerate(encodings)]
    root = write_tars(tmp_path / "masks", samples, per_tar=2)
    run_cli("index", str(root))
    dl = loader(root, batch_size=4, shuffle=False, transform=T.val(32), fields={"jpg": "image", "seg.png": "mask"})
    ((_, masks),) = list(dl)
    assert set(np.unique(masks.numpy())) == {0, 3, 5, 9}
    for mask in masks.numpy()[:-1]:
        np.testing.assert_array_equal(mask, masks.numpy()[-1])


# a palette whose colours' luminance is never their index (index 1 is red, 3 is blue, ...): a
# decode that turned palette colours into grey values would give other ids
COLOURFUL = bytes([255, 255, 255, 250, 10, 10, 10, 250, 10, 20, 20, 240] + [90, 160, 30] * 252)


def encoded(image: Image.Image, format: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=format, **options)
    return out.getvalue()


@pytest.mark.parametrize("kind", ["palette", "one-bit"])
def test_palette_and_one_bit_masks_keep_their_class_ids_on_the_kernel_and_pillow_paths(tmp_path: Path, kind: str) -> None:
    """Palette masks (colourful palette) and 1-bit masks, read by the C kernel (PNG of 1, 4, 8
    bits) and by Pillow (interlaced PNG, GIF, BMP): every batch row holds the class ids the grey
    encoding of the same mask holds (a palette index, not its colour's luminance; 1, not 255)."""
    rng = np.random.default_rng(12)
    classes = np.zeros((52, 70), np.uint8)
    classes[10:40, 5:30], classes[20:, 45:] = 1, 3
    classes[rng.random(classes.shape) < 0.05] = 2
    if kind == "one-bit":
        classes = (classes > 1).astype(np.uint8)
    grey = png(classes, 8, 0, [0])
    if kind == "palette":
        indexed = Image.fromarray(classes, mode="P")
        indexed.putpalette(COLOURFUL)
        encodings = {"png 8-bit": encoded(indexed, "PNG"), "png 4-bit": encoded(indexed, "PNG", bits=4),
                     "interlaced": interlaced(classes, 8, 3, COLOURFUL), "gif": encoded(indexed, "GIF")}
    else:
        bits = Image.fromarray(classes.astype(bool))
        encodings = {"png 1-bit": encoded(bits, "PNG"), "interlaced": interlaced(classes, 1, 0), "bmp": encoded(bits, "BMP")}
    assert read_png_mask(encodings["interlaced"], "k", "m") is None  # Pillow's, not the kernel's
    image = jpeg_bytes(Image.fromarray(np.dstack([classes * 60] * 3)))
    samples = [{"__key__": name.replace(" ", "-"), "jpg": image, "seg": data} for name, data in {"grey": grey, **encodings}.items()]
    root = write_tars(tmp_path / "masks", samples, per_tar=3)
    run_cli("index", str(root))
    backends = ["cpu", "dali"] if importlib.util.find_spec("nvidia.dali") else ["cpu"]
    for backend in backends:
        dl = loader(root, batch_size=len(samples), shuffle=False, transform=T.val(32), backend=backend,
                    fields={"jpg": "image", "seg": "mask"}, return_keys=True)
        ((_, masks, keys),) = list(dl)
        rows = dict(zip(keys, masks.numpy(), strict=True))
        assert set(np.unique(rows["grey"])) == set(np.unique(classes)), backend
        for name in encodings:
            np.testing.assert_array_equal(rows[name.replace(" ", "-")], rows["grey"], err_msg=f"{name} on {backend}")


def test_sixteen_bit_instance_masks_stack_as_uint16(tmp_path: Path) -> None:
    """16-bit grey masks (instance ids over 255) come as uint16 batches, the same through the kernel
    and through Pillow (interlaced); a 16-bit mask where the first samples set uint8 is a SampleError."""
    ids = np.zeros((40, 44), np.uint16)
    ids[5:30, 3:20], ids[18:, 25:] = 1000, 65535
    image = jpeg_bytes(Image.fromarray(np.dstack([(ids >> 8).astype(np.uint8)] * 3)))
    wide = [png(ids, 16, 0, [4]), png(ids, 16, 0, [0, 1, 2, 3])]
    samples = [{"__key__": f"w{i}", "jpg": image, "seg.png": data} for i, data in enumerate(wide)]
    root = write_tars(tmp_path / "wide", samples, per_tar=2)
    run_cli("index", str(root))
    backends = ["cpu", "dali"] if importlib.util.find_spec("nvidia.dali") else ["cpu"]
    for backend in backends:  # DALI's feed crops masks on the CPU and carries them beside its images
        ((_, masks),) = list(loader(root, batch_size=2, shuffle=False, transform=T.val(32), backend=backend,
                                    fields={"jpg": "image", "seg.png": "mask"}))
        assert masks.dtype == torch.uint16 and set(np.unique(masks.numpy())) == {0, 1000, 65535}, backend
        np.testing.assert_array_equal(masks.numpy()[0], masks.numpy()[1])
    narrow = [{"__key__": f"n{i}", "jpg": image, "seg.png": png((ids > 0).astype(np.uint8), 8, 0, [0])} for i in range(9)]
    root = write_tars(tmp_path / "mixed", [*narrow, {"__key__": "late", "jpg": image, "seg.png": wide[0]}], per_tar=9)  # the probe reads the first shard
    run_cli("index", str(root))
    dl = loader(root, batch_size=10, shuffle=False, transform=T.val(32), fields={"jpg": "image", "seg.png": "mask"})
    with pytest.raises(SampleError, match="late.*field seg.png: a 16-bit mask; the batch stacks uint8 masks"):
        list(dl)

"""Masks decoded at the crop: a PNG mask's image data inflated only down to the last row the crop
reads, unfiltered and sampled by nearest neighbour straight into the batch row by the C extension
(``turbo.mask_into``). Pillow decodes the whole mask otherwise; both give the same class ids.

The fast path reads the PNGs a mask is usually stored as: one channel (grey or palette indices)
of 1, 2, 4, 8 or 16 bits (grey: instance ids), not interlaced. Grey of 2 or 4 bits, which Pillow
rescales to 0-255, and anything else go to Pillow (:class:`fastload.fields.MaskCodec`), as do all
masks where the extension was not built. Every chunk's CRC is checked, as Pillow does. A mask of
16 bits is stacked as uint16 (:func:`mask_dtype` tells, from the header), all others as uint8.
The image data is inflated by ISA-L (``pip install 'fastload[masks]'``: python-isal, 3.3x zlib's
speed on masks, a third of a mask's decode) when it is installed, else by zlib: the same bytes.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from fastload.decode.cpu import turbo
from fastload.errors import SampleError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GREY, PALETTE = 0, 3  # PNG colour types of one channel
_FAST_DEPTHS = {GREY: (1, 8, 16), PALETTE: (1, 2, 4, 8)}  # what the kernel reads as Pillow would
WIDE_MODES = ("I;16", "I;16B", "I;16L", "I")  # Pillow's modes of 16-bit masks (and of 32-bit ones)
# None: no extension, or one built before this kernel
_mask_into: Callable[..., None] | None = getattr(turbo, "mask_into", None)


def _inflater() -> tuple[Callable[[], Any], tuple[type[Exception], ...]]:
    """(a new decompressor, the errors it raises for bad data): ISA-L's when python-isal is installed, else zlib's."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.decompressobj, (zlib.error,)
    # cast: isal's stubs type its error as an instance and decompressobj with zlib's arguments
    return cast(Callable[[], Any], isal_zlib.decompressobj), (zlib.error, cast(type[Exception], isal_zlib.error))


_decompressor, _inflate_errors = _inflater()
_DECODE_ERRORS: tuple[type[Exception], ...] = (*_inflate_errors, ValueError)  # ValueError: the kernel's


@dataclass(frozen=True)
class PngMask:
    """A single-channel PNG's geometry and its compressed image data (the IDAT chunks joined)."""

    width: int
    height: int
    bit_depth: int
    data: bytes


def read_png_mask(data: bytes, where: str, field: str) -> PngMask | None:
    """The mask's geometry and compressed data when the fast path reads it, else None (not a PNG,
    or a kind Pillow handles). A SampleError naming the field for a PNG whose chunks are damaged."""
    if _mask_into is None or not data.startswith(PNG_SIGNATURE):
        return None
    header, idat, pos = None, [], len(PNG_SIGNATURE)
    while True:
        if pos + 12 > len(data):
            raise SampleError(where, f"field {field}: truncated PNG (no IEND chunk)")
        length, kind = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        if end > len(data):
            raise SampleError(where, f"field {field}: truncated PNG (a chunk runs past the end)")
        body = data[pos + 8 : end - 4]
        if zlib.crc32(data[pos + 4 : end - 4]) != struct.unpack_from(">I", data, end - 4)[0]:
            raise SampleError(where, f"field {field}: damaged PNG (bad CRC in chunk {kind!r})")
        if header is None:
            if kind != b"IHDR" or length != 13:
                raise SampleError(where, f"field {field}: not a PNG (no IHDR chunk first)")
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND" or idat:  # image data ends at the first other chunk after it
            break
        pos = end
    width, height, depth, colour, _, _, interlace = header
    if interlace or depth not in _FAST_DEPTHS.get(colour, ()) or not width or not height:
        return None
    return PngMask(width, height, depth, b"".join(idat))


def mask_into(
    mask: PngMask, box: tuple[float, float, float, float], flip: bool, out: np.ndarray, where: str, field: str
) -> None:
    """Write the crop ``box`` (x0, y0, x1, y1 in source pixels) of ``mask``'s class ids into ``out``
    (H x W uint8, or uint16: a 16-bit mask needs it) by nearest neighbour, mirrored when ``flip``, inflating no further than its last row."""
    if _mask_into is None:
        raise RuntimeError("fastload's C extension has no mask kernel: read_png_mask gives no PngMask without it")
    out_h, out_w = out.shape
    _, y0, _, y1 = box
    last = min(mask.height - 1, max(0, math.floor(y0 + (out_h - 0.5) * ((y1 - y0) / out_h))))
    stride = (mask.width * mask.bit_depth + 7) // 8 + 1
    try:
        raw = _decompressor().decompress(mask.data, (last + 2) * stride)  # a row to spare
        _mask_into(raw, mask.height, mask.width, mask.bit_depth, box, out, out_h, out_w, flip)
    except _DECODE_ERRORS as exc:
        raise SampleError(where, f"field {field}: cannot decode mask: {exc}") from None


def mask_dtype(data: bytes) -> str:
    """The dtype a mask's batch rows need: ``uint16`` for a 16-bit one (from the header alone),
    else ``uint8`` (also for data that is no image: the decode reports it)."""
    if data.startswith(PNG_SIGNATURE) and len(data) >= 29:
        return "uint16" if data[24] == 16 else "uint8"  # IHDR's bit depth
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            return "uint16" if im.mode in WIDE_MODES else "uint8"
    except Exception:  # Pillow raises many types for bad data
        return "uint8"

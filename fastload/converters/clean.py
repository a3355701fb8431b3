"""Cleaning on the way in: recognise images by content, reject bad ones with a reason, re-encode.

The common case stays cheap: a JPEG or PNG is accepted from its header (size) and its end marker
(completeness) without decoding. Only unusual files (trailing bytes, other formats) are decoded
fully to decide.
"""

from __future__ import annotations

import io
import warnings
from typing import TYPE_CHECKING

from fastload.decode.header import MAX_PIXELS, check_pixels, image_size, jpeg_size, png_size, sniff_image_format
from fastload.errors import SampleError

if TYPE_CHECKING:  # imported where used: checking a JPEG or PNG needs neither
    import numpy as np

_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def _decodes_fully(data: bytes) -> str | None:
    """Decode with Pillow; return None on success, else the reason it fails."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                im.load()
    except Exception as exc:  # Pillow raises many types for bad data
        return f"{type(exc).__name__}: {exc}"
    return None


def check_image(data: bytes, where: str, max_pixels: int = MAX_PIXELS) -> str:
    """Validate encoded image bytes and return their format (the field name to store them under).

    Raises :class:`SampleError` with a reason: empty file, not an image, truncated or corrupt,
    or more pixels than ``max_pixels`` (a decompression bomb).
    """
    if not data:
        raise SampleError(where, "empty file: zero bytes")
    fmt = sniff_image_format(data)
    if fmt is None:
        raise SampleError(where, "not an image: unrecognised signature")
    if fmt == "jpg":
        size, complete = jpeg_size(data), data.rstrip(b"\x00\r\n ").endswith(b"\xff\xd9")
    elif fmt == "png":
        size, complete = png_size(data), data.endswith(_PNG_END)
    else:
        size, complete = None, False
    if size is None:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as im:
                size = im.size
        except Exception as exc:
            raise SampleError(where, f"corrupt {fmt}: {type(exc).__name__}: {exc}") from None
    check_pixels(size[0], size[1], where, max_pixels)
    if not complete:
        failure = _decodes_fully(data)
        if failure is not None:
            kind = "truncated" if "truncated" in failure.lower() else "corrupt"
            raise SampleError(where, f"{kind} {fmt}: {failure}")
    return fmt


def encode_png(pixels: np.ndarray) -> bytes:
    """Losslessly encode HWC (or HW) uint8 pixels as PNG, reproducibly."""
    import numpy as np
    from PIL import Image

    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


def reencode_jpeg(data: bytes, where: str, quality: int, max_size: int | None, max_pixels: int = MAX_PIXELS) -> bytes:
    """Decode, shrink so the longer side is at most ``max_size`` (if given), and re-encode as JPEG.
    A JPEG shrunk by more than half is decoded at the DCT scale M/8 that leaves at least twice the
    output size, then resized with Lanczos from the box the scaled picture covers."""
    from PIL import Image

    from fastload.decode.cpu import decode_image

    width, height = image_size(data, where, max_pixels)
    scale = max_size / max(width, height) if max_size is not None and max(width, height) > max_size else 1.0
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    pixels = decode_image(data, where, 2 * size[1] if scale < 1 else 0, 2 * size[0] if scale < 1 else 0, max_pixels)
    image = Image.fromarray(pixels)
    if scale < 1:
        image = image.resize(size, Image.Resampling.LANCZOS, box=_covered(width, height, pixels.shape[1], pixels.shape[0]))
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality, optimize=False)
    return buf.getvalue()


def _covered(width: int, height: int, decoded_width: int, decoded_height: int) -> tuple[float, float, float, float]:
    """The box of a JPEG decoded at DCT scale M/8 that its picture covers: (0, 0, width * M/8,
    height * M/8), the decoder rounding each side up to whole pixels."""
    for m in range(1, 9):
        if -(-width * m // 8) == decoded_width and -(-height * m // 8) == decoded_height:
            return (0.0, 0.0, width * m / 8, height * m / 8)
    return (0.0, 0.0, float(decoded_width), float(decoded_height))  # not a DCT scale (Pillow decoded it): all of it

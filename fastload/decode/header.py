"""Image headers without decoding: the format from the magic number, the size from the header,
and the one pixel limit every decode path checks that size against before allocating anything."""

from __future__ import annotations

import io
import os

from fastload.errors import SampleError

# Pillow's MAX_IMAGE_PIXELS (a 1.2 KB progressive JPEG claiming 65500x65500 wants ~13 GB of
# coefficients and pixels). The converters' --max-pixels defaults to it; FASTLOAD_MAX_PIXELS raises
# it for the loader, verify and dataset indexing (read once, at import).
MAX_PIXELS: int = int(os.environ.get("FASTLOAD_MAX_PIXELS", "89478485"))

_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "jpg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
)
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def sniff_image_format(data: bytes) -> str | None:
    """The image format of encoded bytes from their magic number (``jpg``, ``png``, ...), else None."""
    for magic, ext in _SIGNATURES:
        if data.startswith(magic):
            return ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's SOF marker, or None if the marker stream is malformed."""
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in _JPEG_SOF:
            if i + 9 > n:
                return None
            return int.from_bytes(data[i + 7 : i + 9], "big"), int.from_bytes(data[i + 5 : i + 7], "big")
        if marker == 0xDA:  # scan data before any frame header
            return None
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return None


def png_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR chunk, or None if it is missing."""
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def check_pixels(width: int, height: int, where: str, max_pixels: int = MAX_PIXELS) -> None:
    """Raise SampleError for an empty image (a zero side) or one over ``max_pixels`` (a bomb)."""
    if width * height > max_pixels:
        raise SampleError(where, f"decompression bomb: {width}x{height} = {width * height} pixels > limit {max_pixels}")
    if width <= 0 or height <= 0:
        raise SampleError(where, f"zero-sized image: {width}x{height}")


def image_size(data: bytes, where: str, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """(width, height) of any supported image, from the header (else Pillow's, lazily), checked
    by :func:`check_pixels`; a header that cannot be read is a SampleError."""
    fmt = sniff_image_format(data)
    size = jpeg_size(data) if fmt == "jpg" else png_size(data) if fmt == "png" else None
    if size is None:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as im:
                size = im.size
        except Exception as exc:  # Pillow raises many types for bad data
            raise SampleError(where, f"cannot read image header: {type(exc).__name__}: {exc}") from None
    check_pixels(size[0], size[1], where, max_pixels)
    return size

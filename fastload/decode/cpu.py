"""CPU decoding: libjpeg-turbo (simplejpeg) for JPEG, with DCT-domain downscaling when the caller
needs fewer pixels; Pillow for everything else (PNG, CMYK JPEG, ...). EXIF orientation is not
applied, as in torchvision's default loader. Strict: a JPEG with corrupt data (a libjpeg warning
anywhere in the image) is an error, and no image over the pixel limit is ever decoded.

Train-time crops go through fastload's own libjpeg-turbo extension, ``turbo`` here (None where it
was not built), which decodes only the crop's region straight into the batch slot."""

from __future__ import annotations

import io

import numpy as np
import simplejpeg
from PIL import Image

from fastload._util.extensions import load_extension
from fastload.decode.header import MAX_PIXELS, check_pixels, image_size
from fastload.errors import SampleError

_PILLOW_JPEG_COLORSPACES = ("CMYK", "YCCK")  # libjpeg-turbo gives no RGB from these: Pillow converts
_TURBO = "fastload.decode._turbo"
turbo = load_extension(_TURBO, "libjpeg-turbo extension", "JPEG crops fall back to the slower simplejpeg/Pillow path")


def jpeg_crop_decoder() -> str:
    """Which library decodes JPEG crops in the loader's workers: the extension's module name, or
    ``simplejpeg`` where it is not available."""
    return _TURBO if turbo is not None else "simplejpeg"


def _pillow_rgb(data: bytes, where: str, max_pixels: int) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        check_pixels(im.width, im.height, where, max_pixels)
        if im.mode.startswith("I"):  # 16/32-bit grayscale: keep the high byte
            im = Image.fromarray((np.asarray(im, dtype=np.uint32) >> 8).astype(np.uint8))
        return np.asarray(im.convert("RGB"))


def decode_image(data: bytes, where: str, min_height: int = 0, min_width: int = 0, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Decode to HWC uint8 RGB. For JPEG, libjpeg-turbo may scale by 1/2, 1/4 or 1/8 in the DCT
    as long as the result stays at least ``min_height`` x ``min_width``; 0 means full size."""
    try:
        image_size(data, where, max_pixels)  # from the header: an empty or oversized image is refused here
        if data[:3] == b"\xff\xd8\xff":
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
            check_pixels(width, height, where, max_pixels)  # and as libjpeg, which allocates, reads it
            if colorspace not in _PILLOW_JPEG_COLORSPACES:
                if min_height or min_width:
                    return simplejpeg.decode_jpeg(
                        data, colorspace="RGB", min_height=min_height, min_width=min_width, min_factor=1
                    )
                return simplejpeg.decode_jpeg(data, colorspace="RGB")
        return _pillow_rgb(data, where, max_pixels)
    except SampleError:
        raise
    except Exception as exc:
        raise SampleError(where, f"cannot decode image: {type(exc).__name__}: {exc}") from None

"""CPU decoding: libjpeg-turbo (simplejpeg) for JPEG, with DCT-domain downscaling when the caller
needs fewer pixels; Pillow for everything else (PNG, CMYK JPEG, ...). EXIF orientation is not
applied, as in torchvision's default loader."""

from __future__ import annotations

import io

import numpy as np
import simplejpeg
from PIL import Image

from fastload.errors import SampleError


def _pillow_rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        if im.mode.startswith("I"):  # 16/32-bit grayscale: keep the high byte
            im = Image.fromarray((np.asarray(im, dtype=np.uint32) >> 8).astype(np.uint8))
        return np.asarray(im.convert("RGB"))


def decode_image(data: bytes, where: str, min_height: int = 0, min_width: int = 0) -> np.ndarray:
    """Decode to HWC uint8 RGB. For JPEG, libjpeg-turbo may scale by 1/2, 1/4 or 1/8 in the DCT
    as long as the result stays at least ``min_height`` x ``min_width``; 0 means full size."""
    try:
        if data[:3] == b"\xff\xd8\xff":
            try:
                if min_height or min_width:
                    return simplejpeg.decode_jpeg(
                        data, colorspace="RGB", min_height=min_height, min_width=min_width, min_factor=1
                    )
                return simplejpeg.decode_jpeg(data, colorspace="RGB")
            except ValueError:
                pass  # e.g. CMYK, or a JPEG libjpeg-turbo refuses: let Pillow try
        return _pillow_rgb(data)
    except Exception as exc:
        raise SampleError(where, f"cannot decode image: {type(exc).__name__}: {exc}") from None

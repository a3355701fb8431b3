"""``--max-size`` on large real photos, side by side in one run: fastload's re-encode (a JPEG
shrunk by more than half decoded at a DCT scale leaving twice the output, then Lanczos) against
the full-size decode then Lanczos (what it did before, and what a hand-written Pillow script does),
both re-encoded at the same quality; and how far apart their pixels are.

    python benchmarks/bench_reencode.py --sizes 512,256 --rounds 3
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_photos import fetch_wallpapers, source_photos

from fastload.converters.clean import reencode_jpeg
from fastload.decode.cpu import decode_image

QUALITY = 90


def full_decode_lanczos(data: bytes, max_size: int) -> bytes:
    """The reference: decode at full size, Lanczos to ``max_size``, encode."""
    image = Image.fromarray(decode_image(data, "reference"))
    scale = max_size / max(image.size)
    image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=QUALITY, optimize=False)
    return buf.getvalue()


def shrink(name: str, data: bytes, max_size: int) -> bytes:
    """``data`` shrunk by ``name``'s way: fastload's or the full-decode reference."""
    return reencode_jpeg(data, "photo", QUALITY, max_size) if name == "fastload" else full_decode_lanczos(data, max_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="512,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path("data/.wallpapers"))
    args = parser.parse_args()
    photos = [path.read_bytes() for path in sorted(source_photos(fetch_wallpapers(args.cache)).values())]
    sizes = sorted({Image.open(io.BytesIO(d)).size for d in photos})
    print(f"{len(photos)} wallpapers, {sizes[0]} to {sizes[-1]} px")
    for max_size in map(int, args.sizes.split(",")):
        times: dict[str, list[float]] = {"fastload": [], "full decode": []}
        for _ in range(args.rounds):  # interleaved
            for name in times:
                start = time.perf_counter()
                for data in photos:
                    shrink(name, data, max_size)
                times[name].append((time.perf_counter() - start) / len(photos) * 1e3)
        ours, reference = (statistics.median(times[k]) for k in ("fastload", "full decode"))
        pixels = {name: [np.asarray(Image.open(io.BytesIO(shrink(name, d, max_size))), dtype=int) for d in photos] for name in times}
        differ = [np.abs(a - b).mean() for a, b in zip(pixels["fastload"], pixels["full decode"], strict=True)]
        print(f"--max-size {max_size}: fastload {ours:.1f} ms an image, full decode + Lanczos {reference:.1f} ms: "
              f"{reference / ours:.2f}x faster; pixels differ by {statistics.mean(differ):.2f} of 255 on average (most {max(differ):.2f})")


if __name__ == "__main__":
    main()

"""Build a realistic benchmark image folder from real photographs.

Source: the JPEG wallpapers of Debian's ``plasma-workspace-wallpapers`` package (fetched with
``apt-get download`` and unpacked with ``dpkg -x`` unless ``--wallpapers`` points at them). Each
output image is a random crop of one wallpaper, resized so its short side is 300-500 px, saved as
JPEG quality 90 — ImageNet-like sizes and content. The class is the wallpaper's name.

    python benchmarks/make_photos.py data/photos --count 4000
"""

from __future__ import annotations

import argparse
import io
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

PACKAGE = "plasma-workspace-wallpapers"


def fetch_wallpapers(cache: Path) -> Path:
    """Download and unpack the wallpaper package into ``cache`` (once); return its wallpapers folder."""
    target = cache / "usr" / "share" / "wallpapers"
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", PACKAGE], cwd=tmp, check=True, capture_output=True)
        deb = next(Path(tmp).glob("*.deb"))
        subprocess.run(["dpkg", "-x", str(deb), str(cache)], check=True)
    return target


def source_photos(wallpapers: Path) -> dict[str, Path]:
    """The largest JPEG of each wallpaper, by wallpaper name."""
    best: dict[str, Path] = {}
    for path in wallpapers.glob("*/contents/images*/*.jpg"):
        name = path.parts[-4]
        if name not in best or path.stat().st_size > best[name].stat().st_size:
            best[name] = path
    return dict(sorted(best.items()))


def crop_box(size: tuple[int, int], rng: np.random.Generator) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of a crop of 20-100% of the short side, aspect 3:4..4:3."""
    w, h = size
    side = rng.uniform(0.2, 1.0) * min(w, h)
    aspect = rng.uniform(3 / 4, 4 / 3)
    cw, ch = min(w, int(side * aspect)), min(h, int(side))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    return x, y, x + cw, y + ch


def random_crop(image: Image.Image, rng: np.random.Generator, box: tuple[int, int, int, int] | None = None) -> Image.Image:
    """A crop (``box``, else one drawn by :func:`crop_box`) resized to a short side of 300-500 px."""
    x, y, right, bottom = box if box is not None else crop_box(image.size, rng)
    cw, ch = right - x, bottom - y
    crop = image.crop((x, y, right, bottom))
    short = int(rng.integers(300, 501))
    scale = short / min(cw, ch)
    return crop.resize((max(short, round(cw * scale)), max(short, round(ch * scale))), Image.Resampling.BILINEAR)


def make_photos(out: Path, count: int, wallpapers: Path, seed: int = 0) -> list[Path]:
    """Write ``count`` photos into ``out/CLASS/NNNNNN.jpg``; return their paths."""
    rng = np.random.default_rng(seed)
    sources = source_photos(wallpapers)
    if not sources:
        raise SystemExit(f"no wallpaper JPEGs under {wallpapers}")
    names = list(sources)
    per_source = -(-count // len(names))
    written: list[Path] = []
    for name in names:
        with Image.open(sources[name]) as im:
            full = im.convert("RGB")
            full.thumbnail((2560, 2560))
        for _ in range(per_source):
            if len(written) == count:
                break
            path = out / name / f"{len(written):06d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            buf = io.BytesIO()
            random_crop(full, rng).save(buf, format="JPEG", quality=90)
            path.write_bytes(buf.getvalue())
            written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--wallpapers", type=Path, help="an unpacked wallpapers folder (default: fetch it)")
    parser.add_argument("--cache", type=Path, default=Path("data/.wallpapers"))
    parser.add_argument("--seed", type=int, default=0, help="another seed gives other crops (e.g. 20: the parity set)")
    args = parser.parse_args()
    wallpapers = args.wallpapers or fetch_wallpapers(args.cache)
    paths = make_photos(args.out, args.count, wallpapers, args.seed)
    total = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} photos in {args.out}: {total / 1e6:.1f} MB, mean {total / len(paths) / 1024:.1f} KiB")


if __name__ == "__main__":
    main()

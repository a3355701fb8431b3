"""Build a benchmark video folder from real footage shipped in Debian packages.

Sources (fetched with ``apt-get download`` and unpacked with ``dpkg -x``, as make_photos.py does
for its wallpapers): the phone video of ``forensics-samples-files`` (a dog; its other video, a
screen recording, is left out), ``python3-imageio`` (a cockatoo), ``python3-mecavideo`` (a bouncing ball) and the
animation of ``openboard-common``. Each output video is a window of ``--seconds`` of one source
at a random start, scaled to a short side of ``--short-side`` px and encoded by ffmpeg's x264
(yuv420p, a keyframe every ``--gop`` frames, no B-frame pyramid changes: x264's defaults
otherwise), the class its source's name: Kinetics-like clips from real footage.

    python benchmarks/make_videos.py data/videos --count 200
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

PACKAGES = ("forensics-samples-files", "python3-imageio", "python3-mecavideo", "openboard-common")
FOOTAGE = {  # name -> path inside the unpacked packages
    "dog": "usr/share/forensics-samples/original-files/movie1/VID_20191220_170832.mp4",
    "cockatoo": "usr/lib/python3/dist-packages/imageio/resources/images/cockatoo.mp4",
    "ball": "usr/share/pymecavideo/data/video/balle-jbart.mp4",
    "animation": "usr/share/openboard/library/videos/wannaworktogether.mp4",
}


def fetch_footage(cache: Path) -> dict[str, Path]:
    """Download and unpack the packages into ``cache`` (once); return each source video's path."""
    if not all((cache / rel).is_file() for rel in FOOTAGE.values()):
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["apt-get", "download", *PACKAGES], cwd=tmp, check=True, capture_output=True)
            for deb in Path(tmp).glob("*.deb"):
                subprocess.run(["dpkg", "-x", str(deb), str(cache)], check=True)
    return {name: cache / rel for name, rel in FOOTAGE.items()}


def duration(path: Path) -> float:
    """The video stream's duration in seconds (ffprobe)."""
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "format=duration",
                          "-of", "json", str(path)], check=True, capture_output=True, text=True).stdout
    return float(json.loads(out)["format"]["duration"])


def make_videos(out: Path, count: int, sources: dict[str, Path], seconds: float, short_side: int, gop: int, seed: int = 0) -> list[Path]:
    """Write ``count`` videos into ``out/SOURCE/NNNNNN.mp4``; return their paths."""
    rng = np.random.default_rng(seed)
    names = sorted(sources)
    lengths = {name: duration(path) for name, path in sources.items()}
    written = []
    for i in range(count):
        name = names[i % len(names)]
        start = float(rng.uniform(0, max(lengths[name] - seconds, 0)))
        path = out / name / f"{i:06d}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        scale = f"scale='if(lt(iw,ih),{short_side},-2)':'if(lt(iw,ih),-2,{short_side})'"
        # fatal only: seeking into a source logs slice errors for the frames before the seek point, which ffmpeg
        # decodes and drops (every output decodes without error: ffmpeg -v error -i OUT -f null -)
        subprocess.run(["ffmpeg", "-v", "fatal", "-y", "-ss", f"{start:.3f}", "-t", str(seconds), "-i", str(sources[name]),
                        "-vf", scale, "-an", "-c:v", "libx264", "-pix_fmt", "yuv420p", "-g", str(gop),
                        "-keyint_min", str(gop), "-sc_threshold", "0", "-threads", "1", str(path)], check=True)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=6.0, help="each video's length (shorter sources: all of it)")
    parser.add_argument("--short-side", type=int, default=320)
    parser.add_argument("--gop", type=int, default=60, help="frames between keyframes")
    parser.add_argument("--cache", type=Path, default=Path("data/.footage"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    paths = make_videos(args.out, args.count, fetch_footage(args.cache), args.seconds, args.short_side, args.gop, args.seed)
    total = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} videos in {args.out}: {total / 1e6:.1f} MB, mean {total / len(paths) / 1024:.1f} KiB")


if __name__ == "__main__":
    main()

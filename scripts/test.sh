#!/usr/bin/env bash
# Run the test suite in the project's venv (created on first use). A full run (no arguments) first
# checks the code with ruff, mypy and lint-imports (pyproject.toml: the layers) and builds the docs
# with `mkdocs build --strict` (mkdocs.yml: a broken link, anchor or API reference fails it), then
# runs pytest without the tests marked slow, then the torchvision tests in their own venv
# (scripts/test_torchvision.sh). `--slow` runs the slow tests alone (.ci/run runs both). Other
# arguments go to pytest alone.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
if [ "${1:-}" = "--slow" ]; then
  shift
  exec python -m pytest -m slow "$@"
fi
if [ "$#" -gt 0 ]; then
  exec python -m pytest "$@"
fi
ruff check .
mypy
lint-imports
site="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$site"  # the variable: Material's notice about MkDocs 2
rm -rf "$site"
python -m pytest -m "not slow"
exec bash scripts/test_torchvision.sh

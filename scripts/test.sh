#!/usr/bin/env bash
# Run the test suite in the project's venv (created on first use). A full run (no arguments) first
# checks the code with ruff and mypy (pyproject.toml) and builds the docs with `mkdocs build --strict`
# (mkdocs.yml: a broken link, anchor or API reference fails it), then runs pytest, then the
# torchvision tests in their own venv (scripts/test_torchvision.sh). Extra arguments go to pytest alone.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
if [ "$#" -gt 0 ]; then
  exec python -m pytest "$@"
fi
ruff check .
mypy
site="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$site"  # the variable: Material's notice about MkDocs 2
rm -rf "$site"
python -m pytest
exec bash scripts/test_torchvision.sh

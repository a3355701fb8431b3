#!/usr/bin/env bash
# Run the test suite in the project's venv (created on first use); a full run (no arguments) then
# runs the torchvision tests in their own venv (scripts/test_torchvision.sh). Extra arguments go to pytest.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
if [ "$#" -gt 0 ]; then
  exec python -m pytest "$@"
fi
python -m pytest
exec bash scripts/test_torchvision.sh

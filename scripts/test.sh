#!/usr/bin/env bash
# Run the test suite in the project's venv (created on first use). Extra arguments go to pytest.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
exec python -m pytest "$@"

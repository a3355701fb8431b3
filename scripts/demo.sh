#!/usr/bin/env bash
# The main job: build a small dataset, convert it, inspect, verify and load it, print throughput.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
exec fastload demo "$@"

#!/usr/bin/env bash
# The whole test suite: set up, build, run ctest (which includes bounded fuzzer runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${DS4_BUILD_DIR:-build}" --output-on-failure -j "${DS4_JOBS:-$(nproc)}"

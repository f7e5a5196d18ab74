#!/usr/bin/env bash
# Soak of ds4d: 32 clients of random requests, cancels, abrupt disconnects, more named
# sessions than --max-sessions and a kill -9 + restart every minute, for --minutes (default
# 10), on the tiny random model unless --model is given. Prints the report (requests served,
# errors by code, lost acknowledged turns, wrong continuations, ds4d RSS first vs last
# minute) and exits non-zero on any loss.
#
#   scripts/soak.sh [BUILD_DIR] [ds4-soak options...]     (default build dir: build)
#   e.g. scripts/soak.sh build-h --minutes 10
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then BUILD=$1; shift; fi
if [ ! -x "$BUILD/bin/ds4-soak" ]; then
    cmake --build "$BUILD" --target ds4-soak ds4d ds4-make-model
fi
exec "$BUILD/bin/ds4-soak" --minutes 10 --clients 32 --kill-every 60 "$@"

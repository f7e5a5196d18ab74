#!/bin/sh
# The ds4 Python package from the source tree over the build tree's libraries, against a real
# ds4d (python_api_test.py), and `pip install ./python` working offline.
# Usage: python_test.sh BUILD_DIR SOURCE_DIR
set -eu
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d /tmp/ds4-python-test-XXXXXX)
daemon_pid=
cleanup() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    [ -f "$work/ds4d.log" ] && sed 's/^/ds4d: /' "$work/ds4d.log" >&2
    exit 1
}
python3 -m pip install --no-index --disable-pip-version-check -q --target "$work/py" "$src/python" \
    >"$work/pip.log" 2>&1 || { cat "$work/pip.log"; fail "pip install --no-index ./python"; }
[ -f "$work/py/ds4/client.py" ] && [ -f "$work/py/ds4/bridge.py" ] || fail "pip installed no package"

"$build/bin/ds4-make-model" --preset tiny --quiet "$work/tiny.gguf" || fail "ds4-make-model"
"$build/bin/ds4d" --model "$work/tiny.gguf" --socket "$work/ds4.sock" --state-dir "$work/state" --backend cpu \
    --threads 1 2>"$work/ds4d.log" &
daemon_pid=$!
i=0
until "$build/bin/ds4" --socket "$work/ds4.sock" stats >/dev/null 2>&1; do
    i=$((i + 1))
    [ $i -lt 600 ] || fail "ds4d did not start"
    kill -0 "$daemon_pid" 2>/dev/null || fail "ds4d exited"
    sleep 0.1
done
export DS4_LIBDIR="$build/lib" PYTHONPATH="$work/py"
(cd "$work" && python3 "$src/tests/packaging/python_api_test.py" "$work/tiny.gguf" "$work/ds4.sock") ||
    fail "python_api_test.py"
kill "$daemon_pid"
wait "$daemon_pid" || fail "ds4d did not stop cleanly"
daemon_pid=

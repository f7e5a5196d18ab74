#!/bin/sh
# `cmake --install` into an empty prefix, then use ds4 from that prefix only: the installed
# ds4d and ds4, a C program built with pkg-config (ds4client), C++ built with pkg-config
# (ds4) and as a CMake project (find_package(ds4)), and the Python package installed with
# pip offline. The programs are the README's examples (examples/); their greedy output must
# equal the installed `ds4 run --raw` and the in-process engine's.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -eu
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d /tmp/ds4-install-test-XXXXXX)
prefix=$work/prefix
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

cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }

for f in bin/ds4d bin/ds4 bin/ds4-make-model bin/ds4-convert lib/libds4.so.3 lib/libds4.so lib/libds4.a \
         lib/libds4client.so.3 lib/libds4client.so include/ds4/bridge/ds4_bridge.h include/ds4/bridge/ds4.hpp \
         include/ds4/client/ds4client.h include/ds4/client/ds4client.hpp share/ds4/ds4.fbs \
         lib/pkgconfig/ds4.pc lib/pkgconfig/ds4client.pc lib/cmake/ds4/ds4Config.cmake \
         lib/cmake/ds4/ds4ConfigVersion.cmake lib/systemd/user/ds4d.service lib/systemd/user/ds4d.socket; do
    [ -e "$prefix/$f" ] || fail "$f is not installed"
done
readelf -d "$prefix/lib/libds4client.so.3" | grep -q 'SONAME.*\[libds4client.so.3\]' || fail "libds4client SONAME"
readelf -d "$prefix/lib/libds4.so.3" | grep -q 'SONAME.*\[libds4.so.3\]' || fail "libds4 SONAME"
grep -qx "ExecStart=$prefix/bin/ds4d \$DS4D_ARGS" "$prefix/lib/systemd/user/ds4d.service" ||
    fail "ds4d.service does not run the installed ds4d"
for b in "$prefix"/bin/*; do
    v=$("$b" --version) || fail "$b --version exits non-zero"
    case "$v" in "$(basename "$b") "[0-9]*" (git "*"; backends: cpu"*) ;; *) fail "$b --version printed: $v" ;; esac
done

# pkg-config sees only the prefix; the variables point into it.
export PKG_CONFIG_LIBDIR="$prefix/lib/pkgconfig" PKG_CONFIG_PATH=
[ "$(cd "$(pkg-config --variable=prefix ds4client)" && pwd)" = "$prefix" ] || fail "ds4client.pc prefix"
[ "$(cd "$(pkg-config --variable=includedir ds4)" && pwd)" = "$prefix/include/ds4" ] || fail "ds4.pc includedir"

# A model and a daemon, both from the prefix.
"$prefix/bin/ds4-make-model" --preset tiny --quiet "$work/tiny.gguf" || fail "ds4-make-model"
export DS4_SOCKET="$work/ds4.sock" DS4_MODEL="$work/tiny.gguf"
"$prefix/bin/ds4d" --state-dir "$work/state" --backend cpu --threads 1 2>"$work/ds4d.log" &
daemon_pid=$!
i=0
until "$prefix/bin/ds4" stats >/dev/null 2>&1; do
    i=$((i + 1))
    [ $i -lt 600 ] || fail "ds4d did not start"
    kill -0 "$daemon_pid" 2>/dev/null || fail "ds4d exited"
    sleep 0.1
done
prompt="def f(x):"
"$prefix/bin/ds4" run --raw --max-tokens 16 "$prompt" >"$work/want" || fail "ds4 run"
echo >>"$work/want"
[ -s "$work/want" ] || fail "no output from ds4 run"

export LD_LIBRARY_PATH="$prefix/lib"
cp -r "$src/examples" "$work/examples"
cc -std=c11 -Wall -Werror "$work/examples/c/generate.c" $(pkg-config --cflags --libs ds4client) -o "$work/gen-c" ||
    fail "C example against ds4client.pc"
"$work/gen-c" "$prompt" >"$work/c.out" || fail "C example run"
cmp -s "$work/want" "$work/c.out" || fail "C example printed '$(cat "$work/c.out")', ds4 run '$(cat "$work/want")'"

c++ -std=c++20 "$work/examples/cpp/complete.cpp" $(pkg-config --cflags --libs ds4) -o "$work/complete-pc" ||
    fail "C++ example against ds4.pc"
"$work/complete-pc" "$DS4_MODEL" "$prompt" >"$work/pc.out" || fail "complete (pkg-config) run"
cmp -s "$work/want" "$work/pc.out" || fail "in-process greedy '$(cat "$work/pc.out")' differs from ds4d's"

cmake -S "$work/examples/cpp" -B "$work/cpp-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
    >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "find_package(ds4)"; }
cmake --build "$work/cpp-build" >"$work/cmake-build.log" 2>&1 || { cat "$work/cmake-build.log"; fail "CMake example build"; }
"$work/cpp-build/complete" "$DS4_MODEL" "$prompt" >"$work/cm1.out" || fail "complete (CMake) run"
"$work/cpp-build/ask" "$prompt" >"$work/cm2.out" || fail "ask (CMake) run"
cmp -s "$work/want" "$work/cm1.out" || fail "CMake complete printed '$(cat "$work/cm1.out")'"
cmp -s "$work/want" "$work/cm2.out" || fail "CMake ask printed '$(cat "$work/cm2.out")'"

# Python: pip offline (no index), into a target directory.
python3 -m pip install --no-index --disable-pip-version-check -q --target "$work/py" "$src/python" \
    >"$work/pip.log" 2>&1 || { cat "$work/pip.log"; fail "pip install ./python"; }
export PYTHONPATH="$work/py"
python3 "$work/examples/python/generate.py" "$prompt" >"$work/py.out" || fail "Python example run"
# Python hands out str: a random model's invalid UTF-8 bytes arrive as U+FFFD.
python3 -c 'import sys; sys.stdout.buffer.write(open(sys.argv[1], "rb").read().decode("utf-8", "replace").encode())' \
    "$work/want" >"$work/want-py"
cmp -s "$work/want-py" "$work/py.out" || fail "Python example printed '$(cat "$work/py.out")'"
(cd "$work" && python3 "$src/tests/packaging/python_api_test.py" "$DS4_MODEL" "$DS4_SOCKET") ||
    fail "python_api_test.py against the installed package"

kill "$daemon_pid"
wait "$daemon_pid" || fail "ds4d did not stop cleanly"
daemon_pid=
echo "install test ok: $prefix"

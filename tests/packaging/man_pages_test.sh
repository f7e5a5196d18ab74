#!/bin/sh
# Every program `cmake --install` puts in bin/ has a man page in share/man/man1, made from its
# own --help (help2man): the page names the program and carries its options.
# Usage: man_pages_test.sh BUILD_DIR
set -eu
build=$(cd "$1" && pwd)
work=$(mktemp -d /tmp/ds4-man-test-XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/p" >"$work/install.log" || { cat "$work/install.log"; exit 1; }
n=0
for b in "$work"/p/bin/*; do
    p=$(basename "$b")
    page="$work/p/share/man/man1/$p.1"
    [ -f "$page" ] || { echo "FAIL: $p has no man page ($page)"; exit 1; }
    grep -q "^\.TH \"\?$(echo "$p" | tr a-z A-Z)" "$page" || { echo "FAIL: $p.1 has no .TH for $p"; exit 1; }
    grep -q '^\.SH NAME' "$page" || { echo "FAIL: $p.1 has no NAME section"; exit 1; }
    # An option from the program's --help appears in the page (help2man escapes '-' as '\-').
    opt=$("$b" --help 2>&1 | grep -o -- '--[a-z][a-z-]*' | grep -v -x -e --help -e --version | head -1 || true)
    if [ -n "$opt" ]; then
        esc=$(printf '%s' "$opt" | sed 's/-/\\\\-/g')
        grep -q -- "$esc" "$page" || { echo "FAIL: $p.1 lacks $opt from its --help"; exit 1; }
    fi
    n=$((n + 1))
done
[ "$n" -ge 10 ] || { echo "FAIL: only $n programs installed"; exit 1; }
echo "ok: $n programs, each with a man page"

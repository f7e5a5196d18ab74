# Sourced by the ds4-bench ctests: $1 ds4-bench, $2 ds4-make-model; a temporary directory
# removed on exit and a tiny Q8_0 model in it.
set -eu
bench=$1
make_model=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$make_model" --preset tiny --type q8_0 --quiet "$dir/m.gguf"

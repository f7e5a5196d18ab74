#!/bin/bash
# One call on the GPU machine: data, both trainings side by side on the one GPU (the small
# models leave it mostly idle, so two processes cost the main model little), evaluation, and
# everything packed into $OUT (the device tool brings back at most 8 files of <= 16 MiB).
#
#   tools/train/device_run.sh smoke   # 30 steps each, a 4-sequence evaluation: checks the path
#   tools/train/device_run.sh full    # MAIN_S / DRAFTER_S seconds of training (default 250 each)
#
# Optional: INIT_MAIN / INIT_DRAFTER = saved HF folders to continue from (carried along).
# EXTRA=all (or NAME,NAME from corpus.EXTRA_LICENCES) adds installed packages' Python source to
# the LM training stream, at most EXTRA_CAP tokens; STDLIB_REPEAT=K puts K copies of the
# stdlib training part in it (prepare_data.py --extra / --extra-cap-tokens / --stdlib-repeat;
# the log shows the per-package table, data.json has it).
# The committed tools/train/tokenizer/ is reused when present, else a tokenizer is trained.
# With the committed tokenizer, the held-out / validation / train streams must equal those of
# the committed run (tools/train/run) when the stdlib is the same (prepare_data.py --reference).
set -u -o pipefail
MODE=${1:?smoke or full}
OUT=${OUT:?OUT must name the output folder}
T=tools/train
W=${WORK:-/tmp/pystd}
rm -rf "$W"
mkdir -p "$W" "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
date -u
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv
python3 -c "import torch, transformers, tokenizers, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__, tokenizers.__version__)"

DATA=()
if [ -f $T/tokenizer/tokenizer.json ]; then
    DATA+=(--tokenizer $T/tokenizer)
    [ -f $T/run/data.json ] && DATA+=(--reference $T/run)
fi
[ -n "${EXTRA:-}" ] && DATA+=(--extra "$EXTRA")
[ -n "${EXTRA_CAP:-}" ] && DATA+=(--extra-cap-tokens "$EXTRA_CAP")
[ -n "${STDLIB_REPEAT:-}" ] && DATA+=(--stdlib-repeat "$STDLIB_REPEAT")
echo "prepare_data.py ${DATA[*]}"
python3 $T/prepare_data.py "$W" "${DATA[@]}" || exit 1

if [ "$MODE" = smoke ]; then
    MAIN=(--steps 30 --check-dense --attn-dropout 0.1)
    DRAFT=(--steps 30 --check-dense --lr 3e-3)
    EVAL=(--n-seq 4 --demo-tokens 12)
else
    MAIN=(--seconds "${MAIN_S:-250}" --attn-dropout 0.1)
    DRAFT=(--seconds "${DRAFTER_S:-250}" --lr 3e-3)
    EVAL=()
fi
[ -n "${INIT_MAIN:-}" ] && MAIN+=(--init-from "$INIT_MAIN" --warmup 30)
[ -n "${INIT_DRAFTER:-}" ] && DRAFT+=(--init-from "$INIT_DRAFTER" --warmup 30)

python3 $T/train_lm.py "$W" --shape main --out "$W/main" "${MAIN[@]}" &
P1=$!
python3 $T/train_lm.py "$W" --shape drafter --out "$W/drafter" "${DRAFT[@]}" &
P2=$!
wait $P1; R1=$?
wait $P2; R2=$?
echo "train exit codes: main $R1 drafter $R2"
[ $R1 = 0 ] && [ $R2 = 0 ] || exit 1

python3 $T/evaluate.py "$W" --main "$W/main/hf" --drafter "$W/drafter/hf" --out "$W/eval" "${EVAL[@]}" || exit 1

# Pack: each HF folder gets the tokenizer (the converter embeds tokenizer.json).
P=$W/pack
mkdir -p "$P"
cp -r "$W/main/hf" "$P/main_hf"
cp -r "$W/drafter/hf" "$P/drafter_hf"
for d in "$P/main_hf" "$P/drafter_hf"; do cp "$W/tokenizer/"* "$d/"; done
cp -r "$W/tokenizer" "$P/tokenizer"
cp "$W/eval/"* "$W/data.json" "$P/"
cp "$W/main/train.json" "$P/train_main.json"
cp "$W/drafter/train.json" "$P/train_drafter.json"
tar -cf "$W/pack.tar" -C "$W" pack
split -b 15M -d "$W/pack.tar" "$OUT/pack.tar.part"
cp "$W/eval/metrics.json" "$OUT/metrics.json"
ls -l "$OUT"
du -sh "$P"/*
date -u

#!/usr/bin/env bash
# A second Llama-style checkpoint no quantization recipe was tuned on (issue #34's targets): the Llama sample's
# recipe (samples/train_sample_llama.py's defaults: the same shape and steps) trained on the King James Bible from
# Genesis to 2 Peter, holding out 1 John to Revelation (the file's last 620 lines, from "1 John 1") as its eval text;
# then every recipe's KL on it (benchmarks/run_llama_recipes.sh). Not shipped: the weights stay in WORK_DIR.
#   bash benchmarks/run_llama_kjv.sh KJV_TXT WORK_DIR [train_sample_llama.py's options, e.g. --steps 200]
set -euo pipefail
cd "$(dirname "$0")/.."
KJV=${1:?the KJV text (kjv.txt)}
W=${2:?work dir}
shift 2
mkdir -p "$W/corpus"
split=$(grep -n '^1 John 1$' "$KJV" | cut -d: -f1)
head -n $((split - 1)) "$KJV" > "$W/corpus/kjv.txt"
tail -n +"$split" "$KJV" > "$W/kjv-heldout.txt"
head -n 800 "$KJV" > "$W/calibration.txt"  # Genesis 1-31, training text, as Emma 1-4 is for the Austen sample
[ -f "$W/checkpoint/model.safetensors" ] || .venv/bin/python samples/train_sample_llama.py --corpus "$W/corpus" \
  --held-out "$W/kjv-heldout.txt" --out "$W/checkpoint" --work-dir "$W/train" "$@"
CAL="$W/calibration.txt" bash benchmarks/run_llama_recipes.sh "$W/checkpoint" "$W/recipes" "$W/kjv-heldout.txt"

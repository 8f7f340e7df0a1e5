#!/usr/bin/env bash
# The main job on the embedded bilingual demo corpus: tokenizer -> preprocess -> pretrain.
# Usage: bash examples/demo.sh [extra pretrain flags, e.g. --train-iters 400]
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO=$(python -c "from megatron_gamma.data import demo_dir; print(demo_dir())")
RUN=runs/demo
export TORCHDYNAMO_DISABLE=1  # no torch.compile (megatron-core's fusions are off here anyway)

if [ -e "$RUN/tokenizer.json" ]; then  # train-tokenizer refuses to overwrite one
  echo "keeping $RUN/tokenizer.json from an earlier demo (delete it to train it again)"
else
  megatron-gamma train-tokenizer --input "$DEMO/zh.jsonl" "$DEMO/en.jsonl" --vocab-size 4096 \
    --lang-key lang --heldout-fraction 0 --output "$RUN/tokenizer.json"  # = the packaged one
fi
megatron-gamma preprocess --input "$DEMO/zh.jsonl" "$DEMO/en.jsonl" \
  --tokenizer-model "$RUN/tokenizer.json" --output-prefix "$RUN/data/demo" --workers 2
megatron-gamma pretrain --config examples/configs/demo.yaml \
  --tokenizer-model "$RUN/tokenizer.json" --data-path "$RUN/data/demo_text_document" \
  --save "$RUN/checkpoints" --overwrite "$@"  # a rerun replaces the previous demo's checkpoints

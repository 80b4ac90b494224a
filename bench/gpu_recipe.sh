#!/usr/bin/env bash
# The learning curve on one GPU (H100 or H200): Qwen2.5-1.5B-Instruct, whose native tool-call
# form (<tool_call> JSON) is the one the compact prompt shows, on the bug-fix family's operator
# and string bugs. SFT on teacher trajectories, then 60 BAR steps of 32 prompts at the paper's
# group settings (N=8, Nmax=16, stride 16), a paired held-out evaluation every 10 steps. SGLang
# samples; each step's weights reach it as a folder (/update_weights_from_disk).
#
#   bench/gpu_recipe.sh [SEED ...]        # default seeds: 0
#   bench/gpu_recipe.sh --dry-run         # the same pipeline on CPU, small: the tiny Llama
#                                         # served by an orchard policy server in another
#                                         # process, 1 RL step of 1 prompt
#
# MODEL (a folder or a Hugging Face id SGLang can load), OUT, PORT and RL (extra --rl changes)
# can be set in the environment. The run checkpoints every step: run the same command with
# RESUME=1 to carry on. The GPU run needs `pip install "sglang[all]"` (not in the CPU venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PORT=${PORT:-30000}
KEY=${KEY:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
SEEDS=("${@:-0}")
RESUME_FLAG=()
[[ "${RESUME:-0}" == 1 ]] && RESUME_FLAG=(--resume)

engine_pid=""
scratch=$(mktemp -d)
cleanup() {
  local rc=$?
  if [[ -n "$engine_pid" ]]; then
    kill "$engine_pid" 2>/dev/null || true
    wait "$engine_pid" 2>/dev/null || true
  fi
  rm -rf "$scratch"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

wait_for() {  # the engine's health endpoint, up to $2 seconds
  for _ in $(seq "$2"); do
    "$PY" -c 'import sys, httpx; httpx.get(sys.argv[1], timeout=2).raise_for_status()' "$1" \
      >/dev/null 2>&1 && return 0
    kill -0 "$engine_pid" 2>/dev/null || { echo "the engine exited before it was ready" >&2; exit 1; }
    sleep 1
  done
  echo "the engine at $1 was not ready in $2 s" >&2; exit 1
}

if [[ $DRY == 1 ]]; then
  OUT=${OUT:-runs/gpu-recipe-dry}
  # Any tiny Llama of the demo's shape: its weights are replaced by the first sync.
  MODEL_DIR="$scratch/engine-start"
  "$PY" - "$MODEL_DIR" <<'EOF'
import sys
from orchard.recipes.models import save_policy, tiny_llama
from orchard.rollout.tokenizer import TEST_TOKENIZER, load_tokenizer
tok = load_tokenizer(TEST_TOKENIZER)
save_policy(tiny_llama(tok, hidden_size=128, layers=2, max_positions=4096), tok, sys.argv[1])
EOF
  ORCHARD_POLICY_KEY="$KEY" "$PY" -m orchard.recipes.policy_server.server \
    --model "$MODEL_DIR" --port "$PORT" &
  engine_pid=$!
  wait_for "http://127.0.0.1:$PORT/health" 120
  "$PY" bench/learning_curve.py --domain bugfix-read --device cpu \
    --engine-url "http://127.0.0.1:$PORT" --engine-kind orchard --engine-key "$KEY" \
    --steps 1 --eval-every 1 --rl "batch=1${RL:+,$RL}" --n-train 8 --n-test 2 \
    --eval-n 1 --sft-steps 4 --concurrency 2 --seeds "${SEEDS[@]}" --out "$OUT" \
    --tag "${TAG:-gpu-recipe-dry}" "${RESUME_FLAG[@]}"
else
  MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
  OUT=${OUT:-runs/gpu-recipe}
  "$PY" -m sglang.launch_server --model-path "$MODEL" --served-model-name policy \
    --port "$PORT" --api-key "$KEY" --mem-fraction-static 0.45 &
  engine_pid=$!
  wait_for "http://127.0.0.1:$PORT/health" 900
  # 512 training tasks feed SFT and 60 steps x 32 prompts; 64 held-out tasks x 2 samples.
  "$PY" bench/learning_curve.py --domain bugfix-read --model "$MODEL" --device cuda \
    --engine-url "http://127.0.0.1:$PORT" --engine-kind sglang --engine-key "$KEY" \
    --steps 60 --eval-every 10 --rl "paper=1,batch=32${RL:+,$RL}" --n-train 512 \
    --n-test 64 --eval-n 2 --concurrency 64 --seeds "${SEEDS[@]}" --out "$OUT" \
    --tag "${TAG:-gpu-qwen2.5-1.5b}" "${RESUME_FLAG[@]}"
fi

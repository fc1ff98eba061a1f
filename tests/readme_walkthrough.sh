#!/usr/bin/env bash
# The README's commands in the order a new user meets them, each checked against its documented exit code.
# Run it from the root of a fresh clone (it creates .venv through `make demo`):
#
#     bash tests/readme_walkthrough.sh [OUT_DIR]        # WALKTHROUGH_TESTS=1 also runs `make test`
#
# Every command's output goes to OUT_DIR/NN-name.log; the dashboard's screens, captured in tmux at 160x48 and
# 80x24, to OUT_DIR/watch-COLSxROWS.txt. The last line says how many steps held; the exit status is 0 only
# when all of them did.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-walkthrough-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
export PATH="$PWD/.venv/bin:$PATH"
n=0 failed=0

# step EXPECTED_RC NAME COMMAND...: run one command, keep its output, compare its exit status.
step() {
  local want=$1 name=$2
  shift 2
  n=$((n + 1))
  local log
  log=$(printf '%s/%02d-%s.log' "$OUT" "$n" "$name")
  local t0=$SECONDS
  "$@" >"$log" 2>&1
  local rc=$?
  if [[ " $want " == *" $rc "* ]]; then
    printf 'ok    %-28s rc=%s (%ss)  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$*"
  else
    printf 'FAIL  %-28s rc=%s, documented %s  %s\n' "$name" "$rc" "$want" "$*"
    tail -n 5 "$log" | sed 's/^/        /'
    failed=$((failed + 1))
  fi
  if grep -q '^Traceback' "$log"; then
    printf 'FAIL  %-28s printed a traceback (%s)\n' "$name" "$log"
    failed=$((failed + 1))
  fi
}

# watch_screen COLS ROWS RUN: the dashboard in a real terminal of that size, its screen kept as text.
watch_screen() {
  local cols=$1 rows=$2 run=$3 session="walkthrough-$$-$1"
  tmux new-session -d -s "$session" -x "$cols" -y "$rows" "grpo-monitor watch $run"
  local screen="$OUT/watch-${cols}x${rows}.txt"
  for _ in $(seq 60); do
    sleep 1
    tmux capture-pane -p -t "$session" >"$screen" 2>/dev/null || break
    grep -q "Overview" "$screen" && grep -q "step" "$screen" && break
  done
  sleep 2
  tmux capture-pane -p -t "$session" >"$screen"
  tmux send-keys -t "$session" q
  sleep 1
  tmux kill-session -t "$session" 2>/dev/null
  grep -q "Overview" "$screen" && grep -qi "step" "$screen"
}

# 1. README command 1: set everything up and run the demo (a sudden collapse, found, restarted).
step 0 make-demo make demo
RUN=$(grep -o 'grpo-monitor analyze [^ ]*' "$OUT"/01-make-demo.log | tail -n 1 | awk '{print $3}')
[ -n "$RUN" ] || { echo "FAIL  the demo printed no analyze command"; failed=$((failed + 1)); RUN=runs/demo; }

# 2. What the demo prints next: analyze (exit 1: the run has a critical finding) and watch.
step 1 analyze grpo-monitor analyze "$RUN"
step 1 analyze-json grpo-monitor analyze "$RUN" --json
step 1 analyze-markdown grpo-monitor analyze "$RUN" --markdown "$WORK/report.md"
step 0 load-run python -c "import grpo_monitor; f = grpo_monitor.load_run('$RUN'); print(f.shape)"
step 0 analyze-python python -c "import grpo_monitor; r = grpo_monitor.analyze('$RUN'); print(type(r).__name__)"
if command -v tmux >/dev/null 2>&1; then
  step 0 watch-160x48 watch_screen 160 48 "$RUN"
  step 0 watch-80x24 watch_screen 80 24 "$RUN"
else
  echo "skip  watch screens: tmux is not installed"
fi
step 2 watch-missing-path grpo-monitor watch "$WORK/no-such-run"

# 3. The other demo scenarios, each with the auto-restart.
step 0 demo-healthy grpo-monitor demo --run-dir "$WORK/healthy"
step 0 demo-collapse grpo-monitor demo --scenario collapse --auto-restart --max-restarts 1 --run-dir "$WORK/collapse"
step 1 analyze-collapse grpo-monitor analyze "$WORK/collapse"
step 0 demo-moe grpo-monitor demo --moe --steps 12 --run-dir "$WORK/moe"

# 4. An own training script, and the same under the supervisor.
step 0 example-train python examples/train.py --output_dir "$WORK/ex" --max_steps 8
step 0 supervise grpo-monitor supervise --run-dir "$WORK/sup" -- python examples/train.py --output_dir "$WORK/sup-out" --max_steps 8

# 5. Pre-flight: lint a recipe and a run, the reward-inspection gate in CI mode.
cat >"$WORK/recipe.yaml" <<'YAML'
model_name_or_path: Qwen/Qwen3-8B
bf16: true
use_vllm: true
vllm_mode: colocate
num_generations: 8
per_device_train_batch_size: 8
gradient_accumulation_steps: 4
learning_rate: 1.0e-6
logging_steps: 1
YAML
step "0 1" lint-recipe grpo-monitor lint "$WORK/recipe.yaml"
step "0 1" lint-run grpo-monitor lint "$RUN"
step "0 1" inspect-rewards grpo-monitor inspect-rewards --demo --auto --run-dir "$WORK/gate"

# 6. Logs people keep: a Trainer checkpoint's state, TensorBoard files.
step "0 1" demo-tensorboard grpo-monitor demo --steps 10 --report-to tensorboard --run-dir "$WORK/tb-run"
step "0 1 3" analyze-folder grpo-monitor analyze "$WORK"

# 7. README command 2, when asked (it takes about 7 minutes).
if [ "${WALKTHROUGH_TESTS:-0}" = 1 ]; then
  step 0 make-test make test
fi

rm -rf "$WORK"
echo "$((n - failed))/$n steps held; logs in $OUT"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# vLLM's rejection samplers (the anchors) and specdec's verifier on the same GPU, in one run.
#
# Runs on the GPU machine from a folder (e.g. the project root) that holds, in ignored subfolders:
#   .anchor/  bench_anchor.py + vllm_stubs.py from this folder, and the two vLLM copies (benches/vllm/README.md)
#   .gl/      the Vulkan/GL loader debs (libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
#   .dev/specdec  a release build of specdec (its `bench` subcommand is benches/verify.rs's code)
# and this folder's side_by_side_join.py / side_by_side_summary.py next to this script.
# e.g.: bash .anchor/side_by_side.sh    (on an H200, after unpacking .gl)
#
# Order: a short untimed specdec warm-up, the vLLM grid (with its correctness checks), the specdec
# grid, then vLLM and specdec once more, so drift shows. Writes under $OUT (8 files at most):
# side_by_side.csv (joined, with specdec/MRV2 ratios), summary.txt, vllm_r1.csv, vllm_r2.csv,
# vllm_meta.json, specdec_r1.csv, specdec_r2.csv, log.txt.
#
# Knobs (environment): SBS_BATCHES (1,8,32,128), SBS_KS (1,4,8), SBS_VOCABS (32000,128256,151936),
# SBS_VOCABS2 (round-2 vocabularies; default SBS_VOCABS), SBS_REPS (50), SBS_ROUNDS (2),
# SBS_MODES (specdec's modes; default all four) and SBS_VLLM_MODES (bench_anchor.py's; default
# all: for greedy alone, SBS_MODES=greedy SBS_VLLM_MODES=greedy),
# SBS_BUDGET_S (430: round 2 shrinks to its last vocabulary, or is skipped, to end within this).
set -u -o pipefail

OUT=${OUT:-$PWD/side-by-side-out}
mkdir -p "$OUT"
B=${SBS_BATCHES:-1,8,32,128}
K=${SBS_KS:-1,4,8}
VOC=${SBS_VOCABS:-32000,128256,151936}
VOC2=${SBS_VOCABS2:-$VOC}
REPS=${SBS_REPS:-50}
MODES=${SBS_MODES:-greedy,draft_probs,draft_logits,one_hot}
ROUNDS=${SBS_ROUNDS:-2}
BUDGET=${SBS_BUDGET_S:-430}
W=$(mktemp -d)
T0=$SECONDS

clocks() {
  echo "[clocks $1, t=$((SECONDS - T0)) s] $(nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu --format=csv,noheader 2>&1)"
}

vllm_round() { # round vocabs budget extra-args...
  local r=$1 v=$2 budget=$3
  shift 3
  clocks "before vLLM round $r"
  local t=$SECONDS
  PYTHONUNBUFFERED=1 python3 .anchor/bench_anchor.py --batches "$B" --ks "$K" --vocabs "$v" \
    --iters "$REPS" --budget-s "$budget" --out "$W/vllm_r$r.csv" --meta "$W/vllm_r${r}_meta.json" \
    ${SBS_VLLM_MODES:+--modes "$SBS_VLLM_MODES"} "$@" \
    | tee "$W/vllm_r$r.stdout"
  echo "[vLLM round $r: exit $?, $((SECONDS - t)) s]"
}

specdec_round() { # round vocabs timeout
  local r=$1 v=$2 limit=$3
  clocks "before specdec round $r"
  local t=$SECONDS
  timeout "$limit" .dev/specdec bench --batch "$B" --k "$K" --vocab "$v" \
    --modes "$MODES" --reps "$REPS" --no-baseline \
    --out "$W/specdec_r$r" 2>&1 | tee "$W/specdec_r$r.stdout"
  echo "[specdec round $r: exit $?, $((SECONDS - t)) s]"
  local csv
  csv=$(ls "$W/specdec_r$r"/*.csv 2>/dev/null | head -n 1)
  if [ -n "$csv" ]; then cp "$csv" "$W/specdec_r$r.csv"; else cp "$W/specdec_r$r.stdout" "$W/specdec_r$r.csv"; fi
  grep -h "twin mismatches over the grid" "$W/specdec_r$r.stdout" || echo "twin mismatch count: not printed (run cut short?)"
}

main() {
  echo "== side_by_side.sh, $(date -u +%FT%TZ), steering $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "grid: R=$B k=$K V=$VOC (round 2: $VOC2), reps $REPS, rounds $ROUNDS, budget ${BUDGET}s"
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  export WGPU_BACKEND=vulkan XDG_RUNTIME_DIR=/tmp
  nvidia-smi
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, torch.cuda.get_device_name())'
  echo "specdec binary: $(sha256sum .dev/specdec | cut -c1-16)"
  .dev/specdec info | tee "$W/info.txt"
  if ! grep -q "Vulkan" "$W/info.txt" && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    echo "no Vulkan adapter: retrying with VK_DRIVER_FILES"
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    .dev/specdec info
  fi

  # On 2026-11-23 the first specdec process on a fresh machine ran at half the copy and read
  # bandwidth of later ones, twice (402/404 vs 813-830 GB/s copy, 1694/1707 vs 4145-4152 GB/s
  # read kernel), cause unknown: a short untimed specdec run first, so round 1 is not that process.
  # Each specdec round's ceilings line ("copy … read kernel …") in the log says whether it ran
  # at full speed.
  clocks "before specdec warm-up"
  local t=$SECONDS
  timeout 120 .dev/specdec bench --batch 1,128 --k 8 --vocab 151936 --modes greedy,one_hot \
    --reps 20 --no-baseline --out "$W/specdec_warmup" | tee "$W/specdec_r0.stdout" | grep -E "read kernel|R=128"
  echo "[specdec warm-up (discarded): $((SECONDS - t)) s]"
  sleep 3

  local left
  vllm_round 1 "$VOC" $((BUDGET / 2))
  sleep 3
  local tv=$((SECONDS - T0))
  left=$((BUDGET - (SECONDS - T0)))
  specdec_round 1 "$VOC" $((left > 30 ? left : 30))
  local t1=$((SECONDS - T0))
  if [ "$ROUNDS" -ge 2 ]; then
    # Round 2 costs about what round 1 did, in proportion to its vocabularies.
    local n1 n2 est
    n1=$(echo "$VOC" | tr ',' '\n' | grep -c .)
    n2=$(echo "$VOC2" | tr ',' '\n' | grep -c .)
    est=$((t1 * n2 / n1))
    if [ $((t1 + est)) -gt "$BUDGET" ]; then
      VOC2=${VOC2##*,}
      est=$((t1 / n1))
      echo "round 2 would overrun the budget: only V=$VOC2 (estimate ${est}s)"
    fi
    if [ $((SECONDS - T0 + est)) -le "$BUDGET" ]; then
      left=$((BUDGET - (SECONDS - T0)))
      vllm_round 2 "$VOC2" $((left / 3 > 10 ? left / 3 : 10)) --skip-correctness
      sleep 3
      left=$((BUDGET - (SECONDS - T0)))
      specdec_round 2 "$VOC2" $((left > 30 ? left : 30))
    else
      echo "round 2 skipped: ${t1}s spent, estimate ${est}s, budget ${BUDGET}s"
    fi
  fi
  clocks "end"
  echo "specdec ceilings per process (warm-up r0, round 1, round 2):"
  grep -H "GB/s (read+write), read kernel" "$W"/specdec_r*.stdout 2>/dev/null

  local args=()
  for r in 1 2; do
    [ -f "$W/vllm_r$r.csv" ] && args+=(--vllm "$r:$W/vllm_r$r.csv") && cp "$W/vllm_r$r.csv" "$OUT/"
    [ -f "$W/specdec_r$r.csv" ] && args+=(--specdec "$r:$W/specdec_r$r.csv") && cp "$W/specdec_r$r.csv" "$OUT/"
  done
  [ -f "$W/vllm_r1_meta.json" ] && cp "$W/vllm_r1_meta.json" "$OUT/vllm_meta.json"
  python3 "$(dirname "$0")/side_by_side_join.py" "${args[@]}" --out "$OUT/side_by_side.csv"
  python3 "$(dirname "$0")/side_by_side_summary.py" "$OUT/side_by_side.csv" | tee "$OUT/summary.txt"
  # The floors of a chain of dependent kernels on each side, from each round's own process.
  { echo; echo "floors of dependent kernel chains (GPU time of 1-4 near-empty kernels in a row):"
    grep -H -E "kernel-chain floor|dispatch-chain floor" "$W"/vllm_r*.stdout "$W"/specdec_r*.stdout \
      | sed "s|^$W/||"; } | tee -a "$OUT/summary.txt"
  echo "== done in $((SECONDS - T0)) s (vLLM round 1 ended at ${tv}s, round 1 at ${t1}s)"
}

main 2>&1 | tee "$OUT/log.txt"

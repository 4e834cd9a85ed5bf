#!/usr/bin/env bash
# A same-run A/B of `specdec bench` variants: processes alternated round by round on one machine,
# joined into one CSV with `round` and `variant` columns, plus a summary of each variant's GPU
# time (and per-kernel times) against the first variant's, point by point.
#
#   bash benches/ab.sh OUT_DIR NAME=BINARY[:SHADER_DIR] NAME=BINARY[:SHADER_DIR] ...
#
# BINARY is a `specdec` build (e.g. .dev/specdec-base); SHADER_DIR, when given, is passed as
# SPECDEC_SHADER_DIR (a kernel variant without a rebuild). Writes OUT_DIR/ab.csv, ab-summary.txt
# and ab-log.txt (three files: the device machine returns at most 8). Knobs (environment):
# AB_ARGS (the bench options, default below), AB_ROUNDS (2), AB_WARM_S (15: one discarded
# process first, so that no variant runs on a GPU still at half speed after a cold start; 0
# skips it),
# AB_TIMEOUT_S (300 per process). Needs the Vulkan loader set up as for side_by_side.sh.
set -u -o pipefail

out=${1:?usage: ab.sh OUT_DIR NAME=BINARY[:SHADER_DIR] ...}
shift
[ $# -ge 2 ] || { echo "ab.sh: give at least two variants" >&2; exit 2; }
args=${AB_ARGS:---batch 1,8,32,128 --k 1,4,8 --vocab 151936 --modes greedy,draft_probs,one_hot --no-baseline --reps 20 --warm-s 3}
rounds=${AB_ROUNDS:-2}
mkdir -p "$out"
work=$(mktemp -d)
log="$out/ab-log.txt"
: >"$log"

first_bin=${1#*=}
first_bin=${first_bin%%:*}
if [ "${AB_WARM_S:-15}" != 0 ]; then
  echo "warm-up (discarded): $first_bin" | tee -a "$log"
  timeout 120 "$first_bin" bench --batch 128 --k 8 --vocab 151936 --modes greedy --reps 10 \
    --no-baseline --warm-s "${AB_WARM_S:-15}" --out "$work/warm" >>"$log" 2>&1
fi

for r in $(seq 1 "$rounds"); do
  for v in "$@"; do
    name=${v%%=*}
    spec=${v#*=}
    bin=${spec%%:*}
    dir=
    [ "$spec" != "$bin" ] && dir=${spec#*:}
    d="$work/$name-$r"
    mkdir -p "$d"
    echo "== round $r, $name: $bin${dir:+ with SPECDEC_SHADER_DIR=$dir}" >>"$log"
    if [ -n "$dir" ]; then
      SPECDEC_SHADER_DIR=$(cd "$dir" && pwd) timeout "${AB_TIMEOUT_S:-300}" "$bin" bench $args --out "$d" >>"$log" 2>&1
    else
      timeout "${AB_TIMEOUT_S:-300}" "$bin" bench $args --out "$d" >>"$log" 2>&1
    fi
    echo "round $r, $name: exit $?, $(grep -h 'twin mismatches over' "$log" | tail -n 1)"
  done
done

{
  header=$(head -n 1 "$(ls "$work"/*-1/*.csv | head -n 1)")
  echo "round,variant,$header"
  for r in $(seq 1 "$rounds"); do
    for v in "$@"; do
      name=${v%%=*}
      for f in "$work/$name-$r"/*.csv; do
        [ -f "$f" ] && tail -n +2 "$f" | sed "s/^/$r,$name,/"
      done
    done
  done
} >"$out/ab.csv"
python3 "$(dirname "$0")/ab_summary.py" "$out/ab.csv" | tee "$out/ab-summary.txt"
rm -rf "$work"

#!/usr/bin/env python3
"""Summarises an A/B CSV of benches/ab.sh (stdlib only).

  ab_summary.py ab.csv

For each variant after the first (the base): its GPU time and per-kernel times over the base's
at the same round and point, as a median, range and count of faster points, over all points and
by batch size; then each point's ratio per round, so that a reader sees whether the rounds agree.
Also the twin mismatches of every variant (a variant with any is not exact).
"""
import csv
import statistics
import sys
from collections import defaultdict

KERNELS = ("row_stats_us", "verify_us", "residual_us", "residual_merge_us")


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = list(csv.DictReader(open(sys.argv[1], newline="")))
    if not rows:
        sys.exit("no rows")
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    base = variants[0]
    at = {(r["round"], r["variant"], r["mode"], r["batch"], r["k"], r["vocab"]): r for r in rows}
    points = sorted({(r["mode"], int(r["batch"]), int(r["k"]), int(r["vocab"])) for r in rows})
    rounds = sorted({r["round"] for r in rows})
    for v in variants:
        bad = sum(int(r["twin_mismatches"] or 0) for r in rows if r["variant"] == v)
        print(f"{v}: {sum(r['variant'] == v for r in rows)} rows, twin mismatches {bad}")
    for v in variants[1:]:
        print(f"\n{v} / {base} (same round, same point)")
        for col in ("gpu_us",) + KERNELS:
            q, by_r = [], defaultdict(list)
            for rnd in rounds:
                for m, b, k, voc in points:
                    x = at.get((rnd, v, m, str(b), str(k), str(voc)))
                    y = at.get((rnd, base, m, str(b), str(k), str(voc)))
                    if x and y and num(y[col]) > 0 and num(x[col]) == num(x[col]):
                        ratio = num(x[col]) / num(y[col])
                        q.append(ratio)
                        by_r[b].append(ratio)
            if not q:
                continue
            parts = ", ".join(f"R={b} {statistics.median(by_r[b]):.3f}" for b in sorted(by_r))
            print(f"  {col:<18} median {statistics.median(q):.3f} ({min(q):.3f}..{max(q):.3f}), "
                  f"faster at {sum(x < 1 for x in q)} of {len(q)}; {parts}")
        print(f"  per point, GPU µs of {base} -> {v} by round:")
        for m, b, k, voc in points:
            cells = []
            for rnd in rounds:
                x = at.get((rnd, v, m, str(b), str(k), str(voc)))
                y = at.get((rnd, base, m, str(b), str(k), str(voc)))
                if x and y:
                    cells.append(f"{num(y['gpu_us']):.1f} -> {num(x['gpu_us']):.1f} "
                                 f"({num(x['gpu_us']) / num(y['gpu_us']):.3f})")
            print(f"    {m:<13} R={b:<4} k={k:<2} V={voc:<7} " + " | ".join(cells))


if __name__ == "__main__":
    main()

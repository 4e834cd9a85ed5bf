#!/usr/bin/env python3
"""Plot a joined side-by-side CSV (side_by_side_join.py) as an SVG: one panel per mode and
vocabulary, specdec's GPU time over vLLM MRV2's (same run, same round) against the batch size R,
one line per draft length k, on a log scale with 1.0 (parity) marked. Below the line specdec is
faster. No plotting library needed (the device machine and CI have none).

Usage: side_by_side_plot.py JOINED.csv OUT.svg [--round N]   (round 1 by default)
"""
import csv
import math
import sys

MODES = ["greedy", "draft_probs", "draft_logits", "one_hot"]
COLOURS = {"1": "#1f77b4", "4": "#ff7f0e", "8": "#2ca02c"}
W, H, PAD = 220, 170, 34  # one panel, and its inner margin
LO, HI = 0.5, 2.5  # the ratio axis (log scale)


def ratios(path, rnd):
    """(mode, V) -> k -> [(R, specdec / MRV2 GPU time)], from the specdec rows' ratio_gpu."""
    out = {}
    for r in csv.DictReader(open(path)):
        if r["impl"] != "specdec" or r["round"] != rnd or not r["ratio_gpu"]:
            continue
        key = (r["mode"], r["V"])
        out.setdefault(key, {}).setdefault(r["k"], []).append((int(r["R"]), float(r["ratio_gpu"])))
    return out


def y_of(q):
    q = min(max(q, LO), HI)
    frac = (math.log(q) - math.log(LO)) / (math.log(HI) - math.log(LO))
    return PAD + (H - 2 * PAD) * (1 - frac)


def panel(x0, y0, title, series):
    """SVG elements of one panel at (x0, y0)."""
    rs = sorted({r for pts in series.values() for r, _ in pts})
    def x_of(r):
        i = rs.index(r)
        return PAD + (W - 2 * PAD) * (i / max(1, len(rs) - 1))
    el = [f'<g transform="translate({x0},{y0})">',
          f'<rect x="{PAD}" y="{PAD}" width="{W - 2 * PAD}" height="{H - 2 * PAD}" fill="none" stroke="#999"/>',
          f'<text x="{W / 2}" y="{PAD - 8}" text-anchor="middle" font-size="11">{title}</text>']
    for q in (0.5, 0.75, 1.0, 1.5, 2.0, 2.5):
        y = y_of(q)
        style = 'stroke="#000" stroke-width="1.2"' if q == 1.0 else 'stroke="#ddd"'
        el.append(f'<line x1="{PAD}" x2="{W - PAD}" y1="{y:.1f}" y2="{y:.1f}" {style}/>')
        el.append(f'<text x="{PAD - 3}" y="{y + 3:.1f}" text-anchor="end" font-size="8">{q:g}</text>')
    for r in rs:
        el.append(f'<text x="{x_of(r):.1f}" y="{H - PAD + 11}" text-anchor="middle" font-size="8">R {r}</text>')
    for k, pts in sorted(series.items(), key=lambda kv: int(kv[0])):
        pts = sorted(pts)
        path = " ".join(f"{x_of(r):.1f},{y_of(q):.1f}" for r, q in pts)
        colour = COLOURS.get(k, "#555")
        el.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for r, q in pts:
            el.append(f'<circle cx="{x_of(r):.1f}" cy="{y_of(q):.1f}" r="2.2" fill="{colour}"/>')
    el.append("</g>")
    return el


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    rnd = sys.argv[sys.argv.index("--round") + 1] if "--round" in sys.argv else "1"
    if "--round" in sys.argv:
        args = [a for a in args if a != rnd]
    data = ratios(args[0], rnd)
    vocabs = sorted({v for _, v in data}, key=int)
    if not vocabs:
        sys.exit(f"no specdec rows with a ratio in round {rnd} of {args[0]}")
    width, height = W * len(MODES), H * len(vocabs) + 40
    el = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">',
          f'<rect width="{width}" height="{height}" fill="#fff"/>',
          f'<text x="8" y="16" font-size="12">specdec GPU time / vLLM MRV2 GPU time (same run, round {rnd}); below 1: specdec faster. '
          + " ".join(f'<tspan fill="{c}">k={k}</tspan>' for k, c in COLOURS.items()) + "</text>"]
    for row, v in enumerate(vocabs):
        for col, mode in enumerate(MODES):
            if (mode, v) in data:
                el += panel(col * W, 30 + row * H, f"{mode}, V = {v}", data[(mode, v)])
    el.append("</svg>")
    with open(args[1], "w") as f:
        f.write("\n".join(el) + "\n")


if __name__ == "__main__":
    main()

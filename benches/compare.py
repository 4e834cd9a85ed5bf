#!/usr/bin/env python3
"""Summarise a benchmark CSV against the anchors: per mode, how many points beat vLLM's graph
time, the worst ratio, and the R=128, k=8 bandwidth fractions. Usage: compare.py RESULT.csv [OLD.csv] [--markdown]"""
import csv, sys
args = [a for a in sys.argv[1:] if not a.startswith('--')]
rows = list(csv.DictReader(open(args[0])))
old = {(r['mode'], r['batch'], r['k'], r['vocab']): float(r['gpu_us']) for r in csv.DictReader(open(args[1]))} if len(args) > 1 else {}
for mode in ['greedy', 'draft_probs', 'draft_logits', 'one_hot']:
    rs = [r for r in rows if r['mode'] == mode and r['anchor_graph_us']]
    if not rs:
        continue
    ratios = [(float(r['gpu_us']) / float(r['anchor_graph_us']), r) for r in rs]
    beat = sum(1 for q, _ in ratios if q <= 1.0)
    worst = max(ratios, key=lambda x: x[0])
    calls = [(float(r['call_us']) / float(r['anchor_median_us']), r) for r in rs if int(r['batch']) <= 8]
    big = [r for r in rs if r['batch'] == '128' and r['k'] == '8']
    print(f"{mode:13} beats graph_us at {beat}/{len(rs)}; worst ours/vLLM {worst[0]:.2f} at R={worst[1]['batch']} k={worst[1]['k']} V={worst[1]['vocab']}; "
          f"call/eager (R<=8) max {max(c for c,_ in calls):.2f}; R=128,k=8 read-bw frac " + ", ".join(f"V={r['vocab']}:{float(r['frac_of_read_bw']):.2f}" for r in big))
if old:
    import statistics
    sp = [old[k] / float(r['gpu_us']) for r in rows for k in [(r['mode'], r['batch'], r['k'], r['vocab'])] if k in old]
    print(f"speed-up vs old: median {statistics.median(sp):.2f}x, min {min(sp):.2f}x, max {max(sp):.2f}x")

if '--markdown' in sys.argv:
    print("\n| mode | R | k | V | specdec GPU µs | vLLM MRV2 graph µs | ours/vLLM | specdec call µs | vLLM eager µs | % of read bw | CPU baseline µs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r['vocab'] == '151936' and r['k'] in ('1', '4', '8') and r['batch'] in ('1', '8', '128'):
            g, a = float(r['gpu_us']), r['anchor_graph_us']
            print(f"| {r['mode']} | {r['batch']} | {r['k']} | {r['vocab']} | {g:.1f} | {a or '-'} | {g/float(a):.2f} | {float(r['call_us']):.1f} | {r['anchor_median_us'] or '-'} | {100*float(r['frac_of_read_bw']):.0f}% | {r['baseline_us'] or '-'} |")

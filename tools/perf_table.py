"""Render a benchmark JSON (docs/perf/*.json) as a Markdown table, for the README.

    python tools/perf_table.py docs/perf/NVIDIA-H200-2026-11-30.json
"""
import json
import re
import sys

SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def main(path):
    doc = json.load(open(path))
    meta, rows = doc["meta"], doc["rows"]
    command = re.sub(r" --out-dir \S+", "", meta["command"])  # where the files went is not part of it
    print(f"{meta['gpu']}, commit {meta['commit']}, {meta['date']}, torch {meta['torch']}: "
          f"`{command}`\n")
    print("| op | shape | dtype | provider | ms | GB/s | × copy |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        m, n = r["shape"]
        if r.get("ms"):
            gbs = 2 * m * n * SIZES[r["dtype"]] / r["ms"] / 1e6
            cells = f"{r['ms']:.3f} | {gbs:.0f} | {r['ms'] / r['copy_ms']:.3f}"
        else:
            cells = f"{r['status'].split(':')[0]} | | "
        print(f"| {r['op']} | {m}×{n} | {r['dtype']} | {r['provider']} | {cells} |")


if __name__ == "__main__":
    main(sys.argv[1])

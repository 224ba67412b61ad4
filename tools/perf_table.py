"""Render a benchmark JSON (docs/perf/*.json) as a Markdown table, for the README and the docs.

    python tools/perf_table.py docs/perf/NVIDIA-H200-2026-11-30.json [--compact]

--compact: one line per case (copy, softlight and each anchor in columns) instead of one per
provider.
"""
import json
import re
import sys

from softlight.bench import counted, moved_bytes as moved


def shape_of(r):
    return "×".join(map(str, r["shape"])) + (f" (dim {r['dim']})" if "dim" in r else "")


def main(path, compact=False):
    doc = json.load(open(path))
    meta, rows = doc["meta"], doc["rows"]
    command = re.sub(r" --out-dir \S+", "", meta["command"])  # where the files went is not part of it
    print(f"{meta['gpu']}, commit {meta['commit']}, {meta['date']}, torch {meta['torch']}: `{command}`\n")
    if not compact:
        print("| op | shape | dtype | provider | ms | GB/s | × copy |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            if counted(r):
                cells = f"{r['ms']:.3f} | {moved(r) / r['ms'] / 1e6:.0f} | {r['ms'] / r['copy_ms']:.3f}"
            elif r.get("ms"):  # wrong, timed all the same
                cells = f"wrong ({r['ms']:.3f}) | | "
            else:
                cells = f"{r['status'].split(':')[0]} | | "
            print(f"| {r['op']} | {shape_of(r)} | {r['dtype']} | {r['provider']} | {cells} |")
        return
    provs = [p for p in dict.fromkeys(r["provider"] for r in rows) if p not in ("copy", "softlight")]
    print("| op | shape | dtype | copy ms | softlight ms (× copy) | " + " | ".join(f"{p} ms" for p in provs) + " |")
    print("|---|---|---|---|---|" + "---|" * len(provs))
    cases = {}
    for r in rows:
        cases.setdefault((r["op"], shape_of(r), r["dtype"]), {})[r["provider"]] = r
    for (op, shape, dtype), by in cases.items():
        def ms(p):
            r = by.get(p)
            if r is None:
                return "–"
            if counted(r):
                return f"{r['ms']:.3f}"
            status = r["status"].split(":")[0].split(" (")[0]
            return f"{status} ({r['ms']:.3f})" if r.get("ms") else status
        sl = by.get("softlight", {})
        sl_cell = f"{sl['ms']:.3f} ({sl['ms'] / sl['copy_ms']:.2f})" if sl and counted(sl) and sl.get("copy_ms") else ms("softlight")
        print(f"| {op} | {shape} | {dtype} | {ms('copy')} | {sl_cell} | " + " | ".join(ms(p) for p in provs) + " |")


if __name__ == "__main__":
    main(sys.argv[1], "--compact" in sys.argv[2:])

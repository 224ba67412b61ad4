"""Where a kernel's instructions and warp stalls go, from Nsight Compute's SASS source page:

    ncu --section SourceCounters --section WarpStateStats -k regex:cluster_rows --launch-skip 1 -c 1 \\
        -o /tmp/rep python tools/profile_once.py 384x262144 bfloat16
    ncu -i /tmp/rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python tools/ncu_sass.py sass.csv --blocks 12 --stalls 12

Blocks: runs of consecutive instructions executed equally often (straight-line code), by their
share of all instructions executed, with their share of the stall samples and their opcodes.
Stalls: the stall reasons over the whole kernel, then the instructions with the most samples and
each one's three main reasons.
"""
import argparse
import csv


def read(path):
    """(header, rows) of the page's table: the line naming the kernel comes first, then the header."""
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    start = next(i for i, r in enumerate(lines) if "Instructions Executed" in r)
    return lines[start], [r for r in lines[start + 1:] if len(r) == len(lines[start])]


def _int(text):
    return int(float(text)) if text.strip() else 0


def opcode(source):
    """The instruction's opcode, past a predicate (`@P0`, `@!P2`)."""
    words = source.split()
    return words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "")


def blocks(header, rows):
    """[(share of instructions, executions, length, share of samples, first row index, opcodes)],
    largest share first."""
    ex, samp, src = (header.index(k) for k in ("Instructions Executed", "Warp Stall Sampling (All Samples)", "Source"))
    total = sum(_int(r[ex]) for r in rows) or 1
    samples = sum(_int(r[samp]) for r in rows) or 1
    runs = []
    for i, r in enumerate(rows):
        n = _int(r[ex])
        if not runs or runs[-1][0] != n:
            runs.append([n, i, []])
        runs[-1][2].append(r)
    out = [(n * len(rs) / total, n, len(rs), sum(_int(r[samp]) for r in rs) / samples, i,
            [opcode(r[src]) for r in rs]) for n, i, rs in runs]
    return sorted(out, key=lambda b: -b[0])


def stalls(header, rows):
    """({reason: share of samples}, [(share, row index, executions, source, [(reason, samples)] top three)])
    the second by samples, most first."""
    samp, src, ex = (header.index(k) for k in ("Warp Stall Sampling (All Samples)", "Source", "Instructions Executed"))
    cols = [(i, h[len("stall_"):]) for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    samples = sum(_int(r[samp]) for r in rows) or 1
    totals = {name: sum(_int(r[i]) for r in rows) / samples for i, name in cols}
    per = []
    for k, r in enumerate(rows):
        reasons = sorted(((name, _int(r[i])) for i, name in cols), key=lambda t: -t[1])[:3]
        per.append((_int(r[samp]) / samples, k, _int(r[ex]), r[src].strip(), reasons))
    return totals, sorted(per, key=lambda t: -t[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--stalls", type=int, default=12)
    a = ap.parse_args()
    header, rows = read(a.csv)
    ex = header.index("Instructions Executed")
    print(f"{sum(_int(r[ex]) for r in rows)} warp instructions executed, {len(rows)} in the kernel")
    cum = 0.0
    for share, n, length, s, i, ops in blocks(header, rows)[:a.blocks]:
        cum += share
        print(f"{100 * share:5.1f} % (cum {100 * cum:5.1f}) x{n:<9d} {length:4d} instructions at {i:5d}, "
              f"{100 * s:4.1f} % of samples: {' '.join(ops)[:200]}")
    totals, per = stalls(header, rows)
    print("stall samples: " + ", ".join(f"{k} {100 * v:.1f} %" for k, v in
                                         sorted(totals.items(), key=lambda kv: -kv[1]) if v >= 0.01))
    for share, k, n, source, reasons in per[:a.stalls]:
        print(f"{100 * share:5.1f} % at {k:5d} x{n:<9d} {source[:60]:60s} "
              + " ".join(f"{name}:{v}" for name, v in reasons))


if __name__ == "__main__":
    main()

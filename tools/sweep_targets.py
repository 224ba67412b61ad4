"""Where a sweep (docs/perf/*.json from `python -m softlight bench --sweep`) stands against the
sweep's targets: at each point softlight's time no more than the best anchor's, and no more than
1.05 x the copy's wherever rows have 1024 elements or more. Only results checked right count.

    python tools/sweep_targets.py docs/perf/NVIDIA-H200-2026-12-01-sweep-passes.json [--points]
    python tools/sweep_targets.py run1.json run2.json [...] [--points]

Prints the counts, the points behind an anchor (which anchor, by how much) and the points over
1.05 x copy; --points adds a line per point. Given several sweeps (runs, or sizes), it does so for
each and then prints, as a Markdown table, every point that misses a target in any of them: its
x copy in each, and the anchor ahead of it and by how much where one is.
"""
import json
import sys

from softlight.bench import counted

ANCHORS = ("torch", "torch.compile", "quack", "liger")
COPY_BOUND = 1.05
COPY_BOUND_FROM_COLS = 1024


def points(rows):
    """{(cols, dtype): {provider: row}} for the forward rows of a sweep, in the order they ran."""
    out = {}
    for r in rows:
        if r["op"] == "forward":
            out.setdefault((r["shape"][-1], r["dtype"]), {})[r["provider"]] = r
    return out


def judge(by):
    """(x copy, best anchor and softlight's ratio to it, ahead, within the copy bound) of one point,
    or None where softlight or the copy has no counted time."""
    sl, cp = by.get("softlight"), by.get("copy")
    if not (sl and cp and counted(sl) and counted(cp)):
        return None
    anchors = {p: by[p]["ms"] for p in ANCHORS if p in by and counted(by[p])}
    best = min(anchors, key=anchors.get) if anchors else None
    ratio = sl["ms"] / anchors[best] if best else None
    x_copy = sl["ms"] / cp["ms"]
    return x_copy, best, ratio, best is None or ratio <= 1.0, x_copy <= COPY_BOUND


def in_copy_bound(j, cols):
    """Whether a judged point meets the copy bound (which holds from COPY_BOUND_FROM_COLS up)."""
    return j[4] or cols < COPY_BOUND_FROM_COLS


def misses(j, cols):
    """Whether a judged point misses either target."""
    return not j[3] or not in_copy_bound(j, cols)


def compare(paths, sweeps):
    """The Markdown table of the points that miss a target in any of the sweeps (their rows, read
    from `paths`)."""
    runs = [points(rows) for rows in sweeps]
    print("\n| point | " + " | ".join(paths) + " |")
    print("|---|" + "---|" * len(paths))
    for cols, dtype in dict.fromkeys(k for run in runs for k in run):
        judged = [judge(run[(cols, dtype)]) if (cols, dtype) in run else None for run in runs]
        if not any(j and misses(j, cols) for j in judged):
            continue
        cells = []
        for j in judged:
            if j is None:
                cells.append("–")
                continue
            x_copy, best, ratio, is_ahead, _ = j
            cells.append(f"{x_copy:.3f}" + ("" if is_ahead else f" ({best} +{100 * (ratio - 1):.1f} %)"))
        print(f"| {dtype} {cols} | " + " | ".join(cells) + " |")


def main(rows, show_points=False):
    ahead = both = judged = 0
    behind, over = [], []
    for (cols, dtype), by in points(rows).items():
        j = judge(by)
        if j is None:
            print(f"{dtype} {cols}: no counted time for softlight or the copy")
            continue
        x_copy, best, ratio, is_ahead, _ = j
        in_bound = in_copy_bound(j, cols)
        judged += 1
        ahead += is_ahead
        both += is_ahead and in_bound
        if not is_ahead:
            behind.append(f"{dtype} {cols} ({best} by {100 * (ratio - 1):.1f} %)")
        if not in_bound:
            over.append(f"{dtype} {cols} ({x_copy:.3f} x)")
        if show_points:
            vs = f"{ratio:.3f} x {best}" if best else "no anchor"
            print(f"{dtype:9s} {cols:>8d}  {x_copy:.3f} x copy  {vs}")
    print(f"ahead of every anchor at {ahead} of {judged} points; both targets at {both}")
    print("behind: " + ("; ".join(behind) or "none"))
    print(f"over {COPY_BOUND} x copy from {COPY_BOUND_FROM_COLS} elements: " + ("; ".join(over) or "none"))


if __name__ == "__main__":
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    sweeps = [json.load(open(path))["rows"] for path in paths]
    for path, rows in zip(paths, sweeps):
        if len(paths) > 1:
            print(f"== {path}")
        main(rows, "--points" in sys.argv[1:])
    if len(paths) > 1:
        compare(paths, sweeps)

"""How evenly the planner's cluster_rows plans share a row among a cluster's CTAs, over a range of
row lengths (planner only, no GPU: the plans an H200 gets). A row's time in the ring is set by the
CTA holding the most of it; `fullest` is that CTA's bytes over the average (1.0: every CTA holds
as many bytes). Consecutive lengths with the same plan are printed as one band.

    python tools/slice_balance.py --elem 2 --from 100000 --to 560000 --step 4096

Each band: its first and last length (elements and KB), the family, and for cluster_rows the
cluster, chunk bytes, ring slots (at the first length), chunks a row, chunks a CTA, threads, and the
fullest CTA's share at the band's first and last length.
"""
import argparse

from softlight import _C

H200 = dict(cc_major=9, cc_minor=0, sm_count=132, smem_optin=232448, max_cluster=16)


def plan_of(cols, elem, gb=1.0):
    """The planner's plan for rows of `cols` elements, aligned to 16 bytes where the length allows,
    as many rows as make about `gb` GB."""
    rows = max(1, int(gb * (1 << 30)) // (cols * elem))
    return _C.plan(rows, cols, elem, cols * elem % 16 == 0, peelable=True, aligned8=cols * elem % 8 == 0,
                   rows128=cols * elem % 128 == 0, **H200)


def fullest(p, cols, elem):
    """The bytes of a row its fullest CTA holds over the average, or None outside cluster_rows."""
    if p["family"] != "cluster_rows":
        return None
    held = min(p["chunks_per_cta"] * p["chunk_bytes"], cols * elem)
    return held * p["cluster"] / (cols * elem)


def key(p):
    """What makes two lengths one band: the same family and, in the ring, the same shape of it."""
    if p["family"] != "cluster_rows":
        return (p["family"], p["cluster"])
    return (p["family"], p["cluster"], p["chunk_bytes"] if p["chunk_bytes"] in (16384, 32768) else "resized",
            p["ring_slots"], p["chunks_per_cta"], p["threads"])


def bands(elem, start, stop, step):
    """[(first cols, last cols, plan of the first, plan of the last, fullest at first, at last)]."""
    out = []
    for cols in range(start, stop + 1, step):
        p = plan_of(cols, elem)
        f = fullest(p, cols, elem)
        if out and key(out[-1][2]) == key(p):
            out[-1][1], out[-1][3], out[-1][5] = cols, p, f
        else:
            out.append([cols, cols, p, p, f, f])
    return [tuple(b) for b in out]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elem", type=int, default=2, choices=[2, 4, 8], help="bytes an element")
    ap.add_argument("--from", dest="start", type=int, default=100000, help="first row length, elements")
    ap.add_argument("--to", dest="stop", type=int, default=560000, help="last row length, elements")
    ap.add_argument("--step", type=int, default=4096, help="elements between lengths")
    a = ap.parse_args(argv)
    print(f"{'elements':>17} {'KB':>11}  plan")
    for first, last, p, q, f0, f1 in bands(a.elem, a.start, a.stop, a.step):
        kb = f"{first * a.elem // 1024}-{last * a.elem // 1024}"
        if p["family"] != "cluster_rows":
            print(f"{first:>8}-{last:<8} {kb:>11}  {p['family']} (cluster {p['cluster']})")
            continue
        chunk = p["chunk_bytes"] if p["chunk_bytes"] == q["chunk_bytes"] else f"{p['chunk_bytes']}-{q['chunk_bytes']}"
        print(f"{first:>8}-{last:<8} {kb:>11}  cluster_rows c{p['cluster']} chunk {chunk} slots {p['ring_slots']} "
              f"chunks/row {p['chunks_per_row']}-{q['chunks_per_row']} /cta {p['chunks_per_cta']} "
              f"threads {p['threads']}  fullest {f0:.3f} -> {f1:.3f}")


if __name__ == "__main__":
    main()

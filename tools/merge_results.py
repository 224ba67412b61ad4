"""Join benchmark JSONs (docs/perf/*.json) of one GPU, commit and torch into one file, for a sweep
run in parts (a sweep of 4 GB tensors takes longer than one run on the GPU machine may). Rows keep
their order, part after part; each case's providers and floor were timed side by side in one part.
The meta's commands are joined with " ; ", and so are differing dates.

    python tools/merge_results.py out.json part1.json part2.json [...]

Refuses parts of another GPU, commit, torch or softlight version, and a case timed in two parts.
"""
import json
import sys

SAME = ("gpu", "commit", "torch", "softlight_version")


def key(r):
    return r["op"], tuple(r["shape"]), r["dtype"], r["provider"], r.get("dim")


def merge(docs):
    first = docs[0]["meta"]
    for d in docs[1:]:
        for k in SAME:
            if d["meta"].get(k) != first.get(k):
                raise SystemExit(f"merge_results: parts differ in {k}: {first.get(k)!r} and {d['meta'].get(k)!r}")
    rows, seen = [], set()
    for d in docs:
        for r in d["rows"]:
            if key(r) in seen:
                raise SystemExit(f"merge_results: {key(r)} is in two parts")
            seen.add(key(r))
            rows.append(r)
    meta = dict(first)
    meta["command"] = " ; ".join(d["meta"]["command"] for d in docs)
    meta["date"] = ", ".join(dict.fromkeys(d["meta"]["date"] for d in docs))
    return {"meta": meta, "rows": rows}


def main(out, parts):
    docs = [json.load(open(p)) for p in parts]
    with open(out, "w") as f:
        json.dump(merge(docs), f, indent=1)
        f.write("\n")
    print(f"{out}: {sum(len(d['rows']) for d in docs)} rows from {len(docs)} parts")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2:])

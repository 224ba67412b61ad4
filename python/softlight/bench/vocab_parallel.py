"""`torchrun --nproc-per-node R -m softlight bench --vocab-parallel`: softlight.vocab_parallel over R
ranks (NCCL between GPUs, gloo between CPU processes), each rank holding R-th of the vocabulary of
the same rows, side by side in one run with:

- one-rank: the single-device function on rows / R whole rows, as many logits as a rank holds
  (cross-entropy's unchecked here: its mean is over other rows);
- torch-vp: the same function over the split vocabulary in plain torch, as tensor-parallel training
  code writes it (an all-reduce of the rows' max, then one of the sums of exponentials and of the
  target's logit; cross-entropy keeps the softmax for its backward);
- all_gather: the collective that softlight.vocab_parallel issues, alone (rows x 6 floats a rank).

cross_entropy times the forward and the backward together (the mean loss); token_logprobs, entropy and
log_softmax the forward. "copy" (a clone of the shard) is the yardstick. Every rank generates the
whole logits from the same seed and checks each provider against the single-device function on them
before timing it. A provider's time is the largest of the ranks' medians. Rank 0 prints and writes the
results; every row has "ranks".
"""
import datetime
import sys
from pathlib import Path

from .common import save_figure, write_results

OPS = ("cross_entropy", "token_logprobs", "entropy", "log_softmax")
SHAPES = {"cuda": "8192x128256,8192x262144", "cpu": "64x32000"}


def _torch_vp(torch, dist):
    """op -> fn(shard, target, start, group): the plain-torch vocab-parallel forms."""
    red = dist.ReduceOp

    def stats(x, group):
        z = x.float()
        m = z.amax(-1)
        dist.all_reduce(m, op=red.MAX, group=group)
        return z - m[:, None], m

    def picked_of(z, target, start):
        local = (target >= start) & (target < start + z.shape[1])
        j = torch.where(local, target - start, torch.zeros_like(target))
        return z.gather(-1, j[:, None])[:, 0] * local, j, local

    class CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, target, start, group):
            z, _ = stats(x, group)
            picked, j, local = picked_of(z, target, start)
            e = z.exp_()
            both = torch.stack([e.sum(-1), picked])
            dist.all_reduce(both, group=group)
            s, picked = both[0], both[1]
            e.div_(s[:, None])  # the softmax, kept for the backward
            ctx.save_for_backward(e, j, local)
            ctx.dtype = x.dtype
            return s.log() - picked

        @staticmethod
        def backward(ctx, g):
            p, j, local = ctx.saved_tensors
            p.scatter_add_(-1, j[:, None], -local.to(p.dtype)[:, None])
            return (p * g[:, None]).to(ctx.dtype), None, None, None

    def token_logprobs(x, target, start, group):
        z, _ = stats(x, group)
        picked = picked_of(z, target, start)[0]
        both = torch.stack([z.exp().sum(-1), picked])
        dist.all_reduce(both, group=group)
        return both[1] - both[0].log()

    def entropy(x, target, start, group):
        z, _ = stats(x, group)
        e = z.exp()
        both = torch.stack([e.sum(-1), (e * z).sum(-1)])
        dist.all_reduce(both, group=group)
        return both[0].log() - both[1] / both[0]

    def log_softmax(x, target, start, group):
        z, _ = stats(x, group)
        s = z.exp().sum(-1)
        dist.all_reduce(s, group=group)
        return (z - s.log()[:, None]).to(x.dtype)

    return {"cross_entropy": lambda x, t, start, group: CrossEntropy.apply(x, t, start, group).mean(),
            "token_logprobs": token_logprobs, "entropy": entropy, "log_softmax": log_softmax}


def run(args, argv, torch, commit):
    import torch.distributed as dist

    import softlight.torch as slt
    import softlight.vocab_parallel as vp
    from .consumers import check, time_ms, with_backward
    from ..vocab_parallel import _all_gather

    device = args.device
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    ops = OPS if args.op == "forward" else (args.op,)
    plain = _torch_vp(torch, dist)
    single = {"cross_entropy": lambda x, t: slt.cross_entropy(x, t), "token_logprobs": slt.token_logprobs,
              "entropy": lambda x, t: slt.entropy(x), "log_softmax": lambda x, t: slt.log_softmax(x, -1)}
    split = {"cross_entropy": lambda x, t: vp.cross_entropy(x, t), "token_logprobs": vp.token_logprobs,
             "entropy": lambda x, t: vp.entropy(x), "log_softmax": lambda x, t: vp.log_softmax(x)}
    shapes = [tuple(int(n) for n in s.split("x")) for s in (args.shapes or SHAPES[device]).split(",")]
    dtypes = (args.dtypes or "bfloat16,float32").split(",")
    gen = torch.Generator(device=device)
    out_rows = []
    for (rows, vocab) in shapes:
        if vocab % ranks or rows % ranks:
            raise SystemExit(f"softlight bench --vocab-parallel: {rows}x{vocab} does not split over {ranks} ranks")
        width, start = vocab // ranks, rank * (vocab // ranks)
        for dtype in dtypes:
            gen.manual_seed(0)
            x = (torch.randn(rows, vocab, device=device, generator=gen) * 3).to(getattr(torch, dtype))
            t = torch.randint(0, vocab, (rows,), device=device, generator=gen)
            shard = x[:, start:start + width].contiguous()
            half, th = x[:rows // ranks].contiguous(), t[:rows // ranks]
            base = {"device": device, "shape": [rows, vocab], "shard": [rows, width], "dtype": dtype, "ranks": ranks}
            copy_ms = _max(torch, dist, time_ms(torch, lambda: shard.clone(), device, args.reps), device)
            for op in ops:
                ce = op == "cross_entropy"
                if ce:
                    loss, g = with_backward(single[op])(x.detach().clone().requires_grad_(), t)
                    want, want_half = (loss.detach(), g[:, start:start + width]), None
                else:
                    whole = single[op](x, t)
                    want = whole[:, start:start + width] if op == "log_softmax" else whole
                    want_half = whole[:rows // ranks]
                lf = with_backward if ce else (lambda f: f)
                leaf = shard.detach().clone().requires_grad_(ce)
                provs = {"softlight": (lf(split[op]), (leaf, t), want),
                         "one-rank": (lf(single[op]), (half.detach().clone().requires_grad_(ce), th), want_half),
                         "torch-vp": (lf(lambda a, b: plain[op](a, b, start, None)), (leaf, t), want)}
                if ce:
                    pack = torch.zeros(rows, 6, device=device)
                    gathered = torch.empty(ranks * rows, 6, device=device)
                    provs["all_gather"] = (lambda: _all_gather(gathered, pack), (), None)
                out_rows.append(dict(base, op=op, provider="copy", status="ok", ms=copy_ms, copy_ms=copy_ms))
                for name, (fn, a, w) in provs.items():
                    if args.providers and name not in args.providers.split(","):
                        continue
                    row = dict(base, op=op, provider=name, status="ok", ms=None, copy_ms=copy_ms)
                    try:
                        got = fn(*a)
                        wrong = None if w is None else check(torch, op, got, *(w if ce else (w, None)), dtype)
                        row["status"] = _status(dist, wrong)
                        row["ms"] = _max(torch, dist, time_ms(torch, lambda: fn(*a), device, args.reps), device)
                    except Exception as e:  # noqa: BLE001 - a provider that fails is reported, not fatal
                        row["status"] = f"failed: {type(e).__name__}: {str(e)[:160]}"
                    out_rows.append(row)
                if rank == 0:
                    line = "  ".join(f"{r['provider']} {r['ms']:.3f}" if r["ms"] else f"{r['provider']} -"
                                     for r in out_rows if r["op"] == op and r["shape"] == base["shape"]
                                     and r["dtype"] == dtype)
                    print(f"{rows}x{vocab} / {ranks} {dtype:9s} {op:14s} ms: {line}", flush=True)
            x = shard = half = None
            if device == "cuda":
                torch.cuda.empty_cache()
    ok = all(r["status"] == "ok" for r in out_rows if r["provider"] in ("copy", "softlight"))
    if rank == 0 and args.out_dir:
        from .consumers import _device_name
        meta = {("gpu" if device == "cuda" else "cpu"): _device_name(torch, device), "ranks": ranks,
                "commit": commit, "command": f"torchrun --nproc-per-node {ranks} -m softlight bench " +
                " ".join(argv if argv is not None else sys.argv[1:]),
                "softlight_version": __import__("softlight").__version__, "torch": torch.__version__,
                "date": datetime.date.today().isoformat(), "op": "vocab-parallel"}
        write_results(meta, out_rows, Path(args.out_dir), args.name, plot_fn=plot)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def _max(torch, dist, ms, device):
    """The largest of the ranks' values."""
    v = torch.tensor([ms], dtype=torch.float64, device=device)
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    return float(v.item())


def _status(dist, wrong):
    """"ok", or the first rank's complaint, the same on every rank."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, wrong)
    bad = [(r, w) for r, w in enumerate(every) if w]
    return "ok" if not bad else f"{bad[0][1]} (rank {bad[0][0]})"


_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def plot(meta, rows, path):
    """Time over the shard's copy for each case: a panel per op, a marker per provider."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ops = list(dict.fromkeys(r["op"] for r in rows))
    cases = list(dict.fromkeys((r["dtype"], r["shape"][1]) for r in rows))
    fig, axes = plt.subplots(1, len(ops), figsize=(3.6 * len(ops), 3.4), squeeze=False, sharey=True)
    for ax, op in zip(axes[0], ops):
        for prov in dict.fromkeys(r["provider"] for r in rows if r["op"] == op and r["provider"] != "copy"):
            pts = [(cases.index((r["dtype"], r["shape"][1])), r["ms"] / r["copy_ms"]) for r in rows
                   if r["op"] == op and r["provider"] == prov and r["status"] == "ok" and r["ms"]]
            if pts:
                ax.plot([p for p, _ in pts], [q for _, q in pts], marker="o", ms=4, lw=0, label=prov)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks(range(len(cases)), [f"{_SHORT.get(d, d)} {v}" for d, v in cases], fontsize=7, rotation=30)
        ax.set_yscale("log")
        ax.set_title(op, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("time / copy of the shard")
    axes[0][0].legend(fontsize=7)
    where = meta.get("gpu") or meta.get("cpu")
    return save_figure(fig, f"vocab-parallel over {meta['ranks']} ranks, {where}, {meta['date']}, "
                            f"commit {meta['commit']}", path)

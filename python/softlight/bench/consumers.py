"""`python -m softlight bench --op cross_entropy | token_logprobs | entropy`: the consumers of the
log-sum-exp (docs/consumers.md) against torch, torch.compile and, on the GPU, Liger and Quack where
they are installed, side by side in one run, over vocabularies of 32000 to 262144 tokens.

- cross_entropy times the forward and the backward together: `loss.backward()` of each provider's mean
  loss. Its floor is one read and one write of the logits. softlight runs in both its modes ("mode" in
  the rows): the gradient into a new array under autograd ("new"), and written over the logits
  (softlight.cross_entropy(x, t, grad=x), "in-place"). softlight and torch also give the mean loss
  alone, of logits that need no gradient (an evaluation's loss: "-loss", "mode" "loss"), whose floor
  is one read.
- token_logprobs times the log-probabilities of one chosen token a row: torch's
  `log_softmax(x.float()).gather` and the memory-saving `x.gather - logsumexp(x)` that RL libraries
  use. Its floor is one read. Each runs in two modes ("mode"): the forward, and the backward alone
  ("-backward": the logits' gradient for an upstream gradient of the log-probs, through the graph of
  one forward, kept), whose floor is a copy.
- entropy times `-(softmax * log_softmax).sum(-1)`, logsumexp `torch.logsumexp(x, -1)`. Their floor is
  one read.

Each provider gets a copy of the logits of its own (Liger's cross-entropy writes its gradient over its
input, as softlight's in-place mode does). "copy" (x.clone(): one read and one write) is the
yardstick. Every provider is checked against float64 before it is timed (the loss, or the values, and
for cross_entropy the gradient too); a wrong or failing one is recorded as such. The GPU is timed
with CUDA events, the CPU with perf_counter, each timed call right after an untimed one of its own.
"""
import datetime
import math
import sys
from pathlib import Path


from .common import cpu_name, time_ms, save_figure, write_results

OPS = ("cross_entropy", "token_logprobs", "entropy", "logsumexp")
VOCABS = (32000, 50257, 128256, 151936, 262144)
TOL = {"float32": 1e-4, "bfloat16": 2e-2, "float64": 1e-10}


def cases(args, device):
    """(rows, vocab, dtype): rows chosen so that the logits hold about --sweep-gb GB (at most 64 MB on
    the CPU)."""
    gb = args.sweep_gb if device == "cuda" else min(args.sweep_gb, 0.0625)
    dtypes = (args.dtypes or "bfloat16,float32").split(",")
    vocabs = [int(v) for v in args.vocabs.split(",")] if args.vocabs else VOCABS
    for dtype in dtypes:
        item = {"float32": 4, "bfloat16": 2, "float64": 8, "float16": 2}[dtype]
        for v in vocabs:
            yield max(1, int(gb * 1e9 / (v * item))), v, dtype


def with_backward(loss_fn):
    """fn(x, t, ...) -> (loss_fn(x, t), the gradient of x, a leaf), after loss.backward()."""
    def run(x, t, *_):
        loss = loss_fn(x, t)
        loss.backward()
        g, x.grad = x.grad, None
        return loss, g
    return run


class Loss:
    """A provider timed in its forward alone, of logits that need no gradient: fn(x, t, idx) -> the
    loss."""

    def __init__(self, fn):
        self.fn = fn


class Backward:
    """A provider timed in its backward alone: the gradient of the logits for an upstream gradient of
    forward(x, t, idx), through the graph of one forward, kept (retain_graph)."""

    def __init__(self, forward):
        self.forward = forward


def providers(torch, op, device, no_compile):
    """name -> fn(x, t, idx) giving the output that the check reads (for cross_entropy, after its
    backward: (loss, grad)), or a Backward."""
    import softlight
    import softlight.torch as slt
    F = torch.nn.functional

    p = {}
    if op == "cross_entropy":
        p["softlight"] = with_backward(lambda x, t: slt.cross_entropy(x, t))
        # The other mode: the gradient written over the logits (given a copy of its own).
        p["softlight-in-place"] = lambda x, t, idx: softlight.cross_entropy(x, t, grad=x)
        p["torch"] = with_backward(lambda x, t: F.cross_entropy(x, t))
        if not no_compile:
            p["torch.compile"] = with_backward(torch.compile(lambda x, t: F.cross_entropy(x, t)))
        p["softlight-loss"] = Loss(lambda x, t, idx: slt.cross_entropy(x, t))
        p["torch-loss"] = Loss(lambda x, t, idx: F.cross_entropy(x, t))
        if device == "cuda":
            try:
                from liger_kernel.transformers import LigerCrossEntropyLoss
                liger = LigerCrossEntropyLoss()
                p["liger"] = with_backward(lambda x, t: liger(x, t))
            except Exception as e:  # noqa: BLE001 - an anchor that is not installed is skipped, and said so
                print(f"# liger not available: {type(e).__name__}: {e}", file=sys.stderr)
            try:
                from quack.cross_entropy import cross_entropy as quack_ce
                p["quack"] = with_backward(lambda x, t: quack_ce(x, t).mean())
            except Exception as e:  # noqa: BLE001
                print(f"# quack not available: {type(e).__name__}: {e}", file=sys.stderr)
    elif op == "token_logprobs":
        p["softlight"] = lambda x, t, idx: slt.token_logprobs(x, idx)
        p["torch"] = lambda x, t, idx: torch.log_softmax(x.float(), -1).gather(-1, idx[:, None])[:, 0]
        p["gather-lse"] = lambda x, t, idx: x.gather(-1, idx[:, None])[:, 0].float() - torch.logsumexp(x.float(), -1)
        if not no_compile:
            p["torch.compile"] = torch.compile(p["torch"])
        for name in ("softlight", "torch", "gather-lse"):
            p[f"{name}-backward"] = Backward(p[name])
        if not no_compile:
            # Compiled apart, a graph with its backward of its own. A backward run again (retain_graph)
            # needs the saved buffers kept, and torch compiles the backward at its first call: so
            # for the whole run (one op a process).
            torch._functorch.config.donated_buffer = False
            p["torch.compile-backward"] = Backward(torch.compile(p["torch"]))
    elif op == "logsumexp":
        p["softlight"] = lambda x, t, idx: slt.logsumexp(x, -1)
        p["torch"] = lambda x, t, idx: torch.logsumexp(x, -1)
        if not no_compile:
            p["torch.compile"] = torch.compile(p["torch"])
    else:
        p["softlight"] = lambda x, t, idx: slt.entropy(x)
        p["torch"] = lambda x, t, idx: -(torch.softmax(x.float(), -1) * torch.log_softmax(x.float(), -1)).sum(-1)
        if not no_compile:
            p["torch.compile"] = torch.compile(p["torch"])
    return p


def reference(torch, op, x, t, idx, dy=None):
    """The float64 result (and gradient: cross_entropy's, or token_logprobs' for the upstream gradient
    dy) the providers are checked against, in chunks of rows."""
    outs, grads = [], []
    for lo in range(0, x.shape[0], 1024):
        xd = x[lo:lo + 1024].double().requires_grad_(op == "cross_entropy" or dy is not None)
        if op == "cross_entropy":
            out = torch.nn.functional.cross_entropy(xd, t[lo:lo + 1024], reduction="sum") / x.shape[0]
            out.backward()
        elif op == "token_logprobs":
            out = torch.log_softmax(xd, -1).gather(-1, idx[lo:lo + 1024, None])[:, 0]
            if dy is not None:
                out.backward(dy[lo:lo + 1024].double())
        elif op == "logsumexp":
            out = torch.logsumexp(xd, -1)
        else:
            out = -(torch.softmax(xd, -1) * torch.log_softmax(xd, -1)).sum(-1)
        outs.append(out.detach())
        if xd.grad is not None:
            grads.append(xd.grad.to(x.dtype) if x.dtype != torch.float32 else xd.grad)
    out = torch.stack(outs).sum() if op == "cross_entropy" else torch.cat(outs)
    return out, torch.cat(grads) if grads else None


def check(torch, op, got, want, want_grad, dtype, backward=False):
    """None, or what is wrong (backward: got is the logits' gradient alone; cross_entropy's loss
    alone: got is (loss, None))."""
    tol = TOL[dtype]
    if op == "cross_entropy" or backward:
        loss, g = got if op == "cross_entropy" else (None, got)
        if loss is not None and not math.isclose(float(loss.detach()), float(want), rel_tol=tol, abs_tol=tol):
            return f"wrong loss ({float(loss.detach()):.6g} against {float(want):.6g})"
        if g is None:
            return None
        err = (g.double() - want_grad.double()).abs().max().item()
        scale = want_grad.double().abs().max().item()
        return None if err <= tol * scale + 1e-12 else f"wrong gradient (max |error| {err:.3g})"
    err = (got.double() - want).abs()
    lim = tol * (1 + want.abs())
    return None if bool((err <= lim).all()) else f"wrong (max |error| {err.max().item():.3g})"


def run(args, argv, torch, commit):
    device = args.device
    op = args.op
    provs = providers(torch, op, device, args.no_compile)
    if args.providers:
        provs = {k: v for k, v in provs.items() if k in args.providers.split(",")}
    gen = torch.Generator(device=device).manual_seed(0)
    rows_out = []
    backward = any(isinstance(fn, Backward) for fn in provs.values())  # (then an upstream gradient a case)
    for rows, vocab, dtype in cases(args, device):
        x = (torch.randn(rows, vocab, device=device, generator=gen) * 3).to(getattr(torch, dtype))
        t = torch.randint(0, vocab, (rows,), device=device, generator=gen)
        dy = torch.randn(rows, device=device, generator=gen) if backward else None
        want, want_grad = reference(torch, op, x, t, t, dy)
        case = []
        row = {"op": op, "device": device, "provider": "copy", "shape": [rows, vocab], "dtype": dtype,
               "status": "ok", "ms": time_ms(torch, lambda: x.clone(), device, args.reps)}
        case.append(row)
        for name, fn in provs.items():
            row = {"op": op, "device": device, "provider": name, "shape": [rows, vocab], "dtype": dtype,
                   "status": "ok", "ms": None}
            if op == "cross_entropy" and (name.startswith("softlight") or isinstance(fn, Loss)):
                row["mode"] = "loss" if isinstance(fn, Loss) else "in-place" if name == "softlight-in-place" else "new"
            if op == "token_logprobs":
                row["mode"] = "backward" if isinstance(fn, Backward) else "forward"
            # A copy of its own: Liger's cross-entropy, like softlight's in-place mode, writes the
            # gradient over the logits it is given, which the next provider would otherwise read.
            arg = x.detach().clone().requires_grad_(op == "cross_entropy" and name != "softlight-in-place"
                                                    and not isinstance(fn, Loss) or isinstance(fn, Backward))
            y = None  # (a Backward's output, whose graph its calls run back through)
            try:
                if isinstance(fn, Backward):
                    y = fn.forward(arg, t, t)
                    call = lambda: torch.autograd.grad(y, arg, dy, retain_graph=True)[0]  # noqa: E731
                elif isinstance(fn, Loss):
                    call = lambda: fn.fn(arg, t, t)  # noqa: E731
                else:
                    call = lambda: fn(arg, t, t)  # noqa: E731
                got = (call(), None) if isinstance(fn, Loss) else call()  # (the loss alone: no gradient)
                wrong = check(torch, op, got, want, want_grad, dtype, isinstance(fn, Backward))
                row["status"] = wrong or "ok"
                row["ms"] = time_ms(torch, call, device, args.reps)
            except Exception as e:  # noqa: BLE001 - a provider that fails is reported, not fatal
                row["status"] = f"failed: {type(e).__name__}: {str(e)[:160]}"
            case.append(row)
            arg = y = None  # (the inputs and graph released before the next provider)
        copy_ms = case[0]["ms"]
        for r in case:
            r["copy_ms"] = copy_ms
        line = "  ".join(f"{r['provider']} {r['ms']:.3f}" if r["ms"] else f"{r['provider']} -" for r in case)
        print(f"{rows}x{vocab} {dtype:9s} ms: {line}", flush=True)
        rows_out += case
        x = want = want_grad = None
        if device == "cuda":
            torch.cuda.empty_cache()
    meta = {("gpu" if device == "cuda" else "cpu"): _device_name(torch, device), "commit": commit,
            "command": "python -m softlight bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "softlight_version": __import__("softlight").__version__, "torch": torch.__version__,
            "date": datetime.date.today().isoformat(), "op": op}
    if args.out_dir:
        write_results(meta, rows_out, Path(args.out_dir), args.name, plot_fn=plot)
    return 0 if all(r["status"] == "ok" for r in rows_out if r["provider"] in ("copy", "softlight")) else 1


def _device_name(torch, device):
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    import os
    return f"{cpu_name()}, {os.cpu_count()} threads"


def plot(meta, rows, path):
    """Time over the copy's against the vocabulary: a panel per dtype, a line per provider."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dtypes = sorted({r["dtype"] for r in rows})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(4.6 * len(dtypes), 3.6), squeeze=False, sharey=True)
    for ax, dtype in zip(axes[0], dtypes):
        for prov in dict.fromkeys(r["provider"] for r in rows if r["provider"] != "copy"):
            pts = sorted((r["shape"][1], r["ms"] / r["copy_ms"]) for r in rows
                         if r["provider"] == prov and r["dtype"] == dtype and r["status"] == "ok" and r["ms"])
            if pts:
                ax.plot([p for p, _ in pts], [q for _, q in pts], marker="o", ms=3, lw=1.2, label=prov)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_title(dtype, fontsize=9)
        ax.set_xlabel("vocabulary")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("time / copy of the logits")
    axes[0][-1].legend(fontsize=7)
    where = meta.get("gpu") or meta.get("cpu")
    return save_figure(fig, f"{meta['op']}, {where}, {meta['date']}, commit {meta['commit']}", path)

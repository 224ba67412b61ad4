"""`python -m softlight bench --op linear_cross_entropy`: the LM head with its loss, hidden (N, D) and
weight (V, D), the mean cross-entropy of hidden @ weight.T forward and backward with the gradients to
both, against the bare GEMMs and the public answers, side by side in one run:

- gemms: the three matmuls of the plain computation alone (h @ W.T, g @ W, g.T @ h) into buffers of
  their own: the floor.
- softlight: softlight.torch.linear_cross_entropy in its two memory forms ("mode": default, the
  speed form, and low_memory); softlight-row_stats: linear_row_stats' token log-probs and entropy
  (RL's pair, "op": "linear_row_stats"), the loss mean(-logprob) + 0.1 mean(entropy), in both forms.
- matmul+softlight: the logits from torch.matmul, softlight.torch.cross_entropy of them.
- torch: torch.nn.functional.cross_entropy of the float32 logits (torch eager); torch.compile: the
  same, compiled.
- liger: Liger's LigerFusedLinearCrossEntropyLoss; cce and cce-exact: Cut Cross-Entropy's
  linear_cross_entropy with its default gradient filter and without one (filter_eps=None), where they
  are installed.

Each provider gets inputs of its own and is checked against float64 (the loss, and both gradients
normwise) before it is timed; a wrong or failing one is recorded as such. "peak_mib" is the peak of
the allocator above the inputs during one step (torch.cuda.max_memory_allocated; the process's
resident size on the CPU is not measured: null there), "grads_mib" the two gradients' own bytes.
"""
import datetime
import math
import sys
from pathlib import Path


from .common import cpu_name, time_ms, parse_shapes, save_figure, write_results

SHAPES = ((8192, 2304, 256000), (8192, 4096, 128256), (16384, 1024, 32000), (32768, 4096, 151936))
TOL = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 2e-2, "float64": 1e-10}


# The entropy's weight in the row statistics' loss, mean(-logprob) + ENTROPY * mean(entropy).
ENTROPY = 0.1


def providers(torch, device, no_compile):
    """name -> (mode or None, fn(h, w, t) returning the loss after its backward, the entropy's weight
    in that loss: 0 for cross-entropy)."""
    import softlight.torch as slt
    F = torch.nn.functional

    def with_backward(loss_fn):
        def run(h, w, t):
            loss = loss_fn(h, w, t)
            loss.backward()
            return loss
        return run

    def eager(h, w, t):
        return F.cross_entropy((h @ w.t()).float(), t)

    def stats(memory):
        def loss(h, w, t):
            st = slt.linear_row_stats(h, w, t, memory=memory)
            return -st["logprobs"].mean() + ENTROPY * st["entropy"].mean()
        return with_backward(loss)

    p = {"softlight": ("default", with_backward(lambda h, w, t: slt.linear_cross_entropy(h, w, t)), 0.0),
         "softlight-low_memory": ("low_memory", with_backward(
             lambda h, w, t: slt.linear_cross_entropy(h, w, t, memory="low_memory")), 0.0),
         "softlight-row_stats": ("default", stats("speed"), ENTROPY),
         "softlight-row_stats-low_memory": ("low_memory", stats("low_memory"), ENTROPY),
         "matmul+softlight": (None, with_backward(lambda h, w, t: slt.cross_entropy(h @ w.t(), t)), 0.0),
         "torch": (None, with_backward(eager), 0.0)}
    if not no_compile:
        p["torch.compile"] = (None, with_backward(torch.compile(eager)), 0.0)
    if device == "cuda":
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
            liger = LigerFusedLinearCrossEntropyLoss()
            p["liger"] = (None, with_backward(lambda h, w, t: liger(w, h, t)), 0.0)
        except Exception as e:  # noqa: BLE001 - an anchor that is not installed is skipped, and said so
            print(f"# liger not available: {type(e).__name__}: {e}", file=sys.stderr)
        try:
            from cut_cross_entropy import linear_cross_entropy as cce
            p["cce"] = (None, with_backward(lambda h, w, t: cce(h, w, t)), 0.0)
            p["cce-exact"] = (None, with_backward(lambda h, w, t: cce(h, w, t, filter_eps=None)), 0.0)
        except Exception as e:  # noqa: BLE001
            print(f"# cce not available: {type(e).__name__}: {e}", file=sys.stderr)
    return p


def reference(torch, h, w, t, entropy=0.0):
    """(loss, d hidden, d weight) of the mean cross-entropy in float64, in chunks of tokens; with
    `entropy`, of mean(-logprob) + entropy * mean(entropy of the row), whose gradient to the logits
    adds entropy * -p (log p + H)."""
    hd, wd = h.double(), w.double()
    n = h.shape[0]
    step = max(1, (1 << 28) // max(1, w.shape[0]))
    loss = torch.zeros((), dtype=torch.float64, device=h.device)
    dh, dw = torch.empty_like(hd), torch.zeros_like(wd)
    for lo in range(0, n, step):
        z = hd[lo:lo + step] @ wd.t()
        lse = torch.logsumexp(z, -1)
        tc = t[lo:lo + step]
        loss += (lse - z.gather(1, tc[:, None])[:, 0]).sum()
        z.sub_(lse[:, None])  # log p
        if entropy:
            p = z.exp()
            ent = -(p * z).sum(-1)
            loss += entropy * ent.sum()
            z.add_(ent[:, None]).mul_(p).mul_(-entropy).add_(p)  # p - entropy * p (log p + H)
            del p
        else:
            z.exp_()
        z[torch.arange(z.shape[0], device=z.device), tc] -= 1
        z.div_(n)
        dh[lo:lo + step] = z @ wd
        dw.addmm_(z.t(), hd[lo:lo + step])
        del z
    return loss / n, dh, dw


def check(loss, gh, gw, want, dtype):
    """None, or what is wrong: the loss within the dtype's tolerance, each gradient normwise."""
    tol = TOL[dtype]
    if not math.isclose(float(loss), float(want[0]), rel_tol=tol, abs_tol=tol):
        return f"wrong loss ({float(loss):.6g} against {float(want[0]):.6g})"
    for name, g, r in (("hidden", gh, want[1]), ("weight", gw, want[2])):
        if g is None:
            return f"no gradient to {name}"
        err = float((g.double() - r).norm() / r.norm().clamp_min(1e-300))
        if not err <= tol:
            return f"wrong gradient to {name} (normwise error {err:.3g})"
    return None


def _inputs(torch, n, d, v, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(n, d, device=device, generator=g).to(dtype)
    w = (torch.randn(v, d, device=device, generator=g) / math.sqrt(d)).to(dtype)
    t = torch.randint(0, v, (n,), device=device, generator=g)
    return h, w, t


def run(args, argv, torch, commit):
    device = args.device
    shapes = parse_shapes(args.shapes) if args.shapes else SHAPES
    if any(len(s) != 3 for s in shapes):
        raise SystemExit("softlight bench --op linear_cross_entropy: --shapes are NxDxV, e.g. 8192x4096x128256")
    provs = providers(torch, device, args.no_compile)
    if args.providers:
        provs = {k: v for k, v in provs.items() if k in args.providers.split(",")}
    reps = args.reps
    cuda = device == "cuda"
    rows_out = []
    meta = {("gpu" if cuda else "cpu"): torch.cuda.get_device_name(0) if cuda else cpu_name(), "commit": commit,
            "command": "python -m softlight bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "softlight_version": __import__("softlight").__version__, "torch": torch.__version__,
            "date": datetime.date.today().isoformat(), "op": "linear_cross_entropy"}
    for n, d, v in shapes:
        for dtype in (args.dtypes or "bfloat16").split(","):
            tdt = getattr(torch, dtype)
            h, w, t = _inputs(torch, n, d, v, tdt, device, 0)
            wants = {0.0: reference(torch, h, w, t)}
            grads_mib = (h.numel() + w.numel()) * h.element_size() / 2**20
            base = {"op": "linear_cross_entropy", "device": device, "shape": [n, d, v], "dtype": dtype,
                    "grads_mib": round(grads_mib, 3)}
            z, dh, dw = torch.empty(n, v, dtype=tdt, device=device), torch.empty_like(h), torch.empty_like(w)

            def gemms():
                torch.matmul(h, w.t(), out=z)
                torch.matmul(z, w, out=dh)
                torch.matmul(z.t(), h, out=dw)

            case = [dict(base, provider="gemms", mode=None, status="ok", ms=time_ms(torch, gemms, device, reps, False),
                         peak_mib=None)]
            z = dh = dw = None
            for name, (mode, fn, entropy) in provs.items():
                row = dict(base, provider=name, mode=mode, status="ok", ms=None, peak_mib=None)
                if entropy:
                    row["op"] = "linear_row_stats"
                    if entropy not in wants:
                        wants[entropy] = reference(torch, h, w, t, entropy)
                want = wants[entropy]
                hh, ww = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()

                def step():
                    hh.grad = ww.grad = None
                    return fn(hh, ww, t)

                try:
                    if cuda:
                        torch.cuda.synchronize()
                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats()
                        at = torch.cuda.memory_allocated()
                    loss = step()
                    if cuda:
                        torch.cuda.synchronize()
                        row["peak_mib"] = round((torch.cuda.max_memory_allocated() - at) / 2**20, 1)
                    row["status"] = check(loss.detach(), hh.grad, ww.grad, want, dtype) or "ok"
                    loss = None
                    row["ms"] = time_ms(torch, step, device, reps, False)
                except Exception as e:  # noqa: BLE001 - a provider that fails is reported, not fatal
                    row["status"] = f"failed: {type(e).__name__}: {str(e)[:160]}"
                hh = ww = loss = None
                case.append(row)
            for r in case:
                r["gemms_ms"] = case[0]["ms"]
            line = "  ".join(f"{r['provider']} {r['ms'] / r['gemms_ms']:.3f}x" + (
                f" +{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "") if r["ms"] else
                f"{r['provider']} {r['status'][:40]}" for r in case)
            print(f"{n}x{d}x{v} {dtype} gemms {case[0]['ms']:.2f} ms, grads {grads_mib:.0f} MiB: {line}", flush=True)
            rows_out += case
            h = w = t = want = wants = None
            if cuda:
                torch.cuda.empty_cache()
            if args.out_dir:  # after every case: a run cut short keeps what it measured
                write_results(meta, rows_out, Path(args.out_dir), args.name, plot_fn=plot)
    return 0 if all(r["status"] == "ok" for r in rows_out if r["provider"] == "gemms" or
                    r["provider"].startswith("softlight")) else 1


def plot(meta, rows, path):
    """Time over the bare GEMMs' (left) and memory above the inputs over the gradients' (right), a
    group of bars per shape."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shapes = list(dict.fromkeys(tuple(r["shape"]) for r in rows))
    provs = [p for p in dict.fromkeys(r["provider"] for r in rows) if p != "gemms"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / max(1, len(provs))
    for i, prov in enumerate(provs):
        for ax, key in zip(axes, ("ms", "peak_mib")):
            xs, ys = [], []
            for j, s in enumerate(shapes):
                r = next((r for r in rows if r["provider"] == prov and tuple(r["shape"]) == s), None)
                if r and r["status"] == "ok" and r[key]:
                    xs.append(j + i * width)
                    ys.append(r["ms"] / r["gemms_ms"] if key == "ms" else r["peak_mib"] / r["grads_mib"])
            ax.bar(xs, ys, width, label=prov)
    for ax, label in zip(axes, ("time / bare GEMMs", "peak above inputs / gradients")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))])
        ax.set_xticklabels(["x".join(map(str, s)) for s in shapes], fontsize=7)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_ylabel(label)
        ax.set_yscale("log", base=2)
        ax.grid(alpha=0.3, axis="y")
    axes[1].legend(fontsize=7)
    where = meta.get("gpu") or meta.get("cpu")
    return save_figure(fig, f"linear_cross_entropy (N x D x V), {where}, {meta['date']}, commit {meta['commit']}",
                       path)


HF_LLAMA = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=16,
                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=4096)


def run_hf_step(args, argv, torch, commit):
    """--op hf_step: one training step (forward and backward with labels) of a Hugging Face Llama built
    from a config (HF_LLAMA, bfloat16, batch 2 x 4096 by default: --shapes BxT), as it comes
    ("transformers"), patched by softlight.transformers in either memory form ("softlight",
    "softlight-low_memory") and by Liger's apply_liger_kernel_to_llama, where it is installed: as it
    comes ("liger": its RoPE, RMSNorm and SwiGLU kernels too, which keep fewer activations) and its
    loss alone ("liger-flce", the part softlight replaces): time, and the allocator's peak above the
    model, its inputs and its gradients' buffers from an earlier step. Each loss is checked against
    the unpatched model's first."""
    import copy

    import transformers

    import softlight.transformers as slx
    device = args.device
    if device != "cuda":
        raise SystemExit("softlight bench --op hf_step: on a GPU")
    batch, seq = parse_shapes(args.shapes)[0] if args.shapes else (2, 4096)
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF_LLAMA)).to(device, torch.bfloat16).train()
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, HF_LLAMA["vocab_size"], (batch, seq), device=device, generator=g)

    def patched_by(name):
        if name == "transformers":
            return base
        model = copy.deepcopy(base)
        if name.startswith("softlight"):
            return slx.patch(model, memory="low_memory" if name.endswith("low_memory") else "speed")
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        loss_alone = dict(rope=False, swiglu=False, rms_norm=False) if name == "liger-flce" else {}
        apply_liger_kernel_to_llama(model=model, fused_linear_cross_entropy=True, cross_entropy=False, **loss_alone)
        return model

    rows, want = [], None
    meta = {"gpu": torch.cuda.get_device_name(0), "commit": commit,
            "command": "python -m softlight bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "softlight_version": __import__("softlight").__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "date": datetime.date.today().isoformat(), "op": "hf_step"}
    for name in ("transformers", "softlight", "softlight-low_memory", "liger", "liger-flce"):
        row = {"op": "hf_step", "device": device, "provider": name, "model": "llama", "config": HF_LLAMA,
               "shape": [batch, seq], "dtype": "bfloat16", "status": "ok", "ms": None, "peak_mib": None}
        try:
            model = patched_by(name)

            def step():
                model.zero_grad(set_to_none=False)
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                return loss

            loss = step()  # (the gradients' buffers exist from here on)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            at = torch.cuda.memory_allocated()
            loss = step()
            torch.cuda.synchronize()
            row["peak_mib"] = round((torch.cuda.max_memory_allocated() - at) / 2**20, 1)
            value = float(loss)
            want = value if want is None else want
            if not math.isclose(value, want, rel_tol=1e-2):
                row["status"] = f"wrong loss ({value:.6g} against {want:.6g})"
            row["ms"] = time_ms(torch, step, device, args.reps, False)
            row["loss"] = value
        except Exception as e:  # noqa: BLE001 - a provider that fails is reported, not fatal
            row["status"] = f"failed: {type(e).__name__}: {str(e)[:160]}"
        model = None
        torch.cuda.empty_cache()
        rows.append(row)
        print(f"hf_step {name}: {row['ms'] and round(row['ms'], 2)} ms, peak +{row['peak_mib']} MiB, {row['status']}",
              flush=True)
    if args.out_dir:
        write_results(meta, rows, Path(args.out_dir), args.name, plot_fn=plot_hf_step)
    return 0 if all(r["status"] == "ok" for r in rows if not r["provider"].startswith("liger")) else 1


def plot_hf_step(meta, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in rows if r["status"] == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, key, label in zip(axes, ("ms", "peak_mib"), ("step time (ms)", "peak above the model (MiB)")):
        ax.bar([r["provider"] for r in ok], [r[key] for r in ok])
        ax.set_ylabel(label)
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
        ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, f"Llama training step (2 layers, vocabulary 128256), {meta['gpu']}, {meta['date']}, "
                            f"commit {meta['commit']}", path)

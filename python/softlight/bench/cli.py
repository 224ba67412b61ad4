"""`python -m softlight bench`: softlight against a copy of the same bytes and the public anchors,
side by side in one run, timed with CUDA events through cuda.core.

Every provider's output is checked against a float64 reference before it is timed; a provider that
is wrong is reported as wrong (its time is recorded, but no table or plot counts it). Results go to
<out-dir>/<name>.json and a PNG (one pair per benchmark, overwritten when measured again; the default
out-dir is softlight-bench/ in the working directory, the repository's figures --out-dir docs/perf).
"""
import argparse
import sys

from .common import git_commit
from .forward import SWEEP_COLS


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m softlight bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=None, help="comma-separated shapes, e.g. 4096x393216,64x4096x4096 (default: "
                                                   "4096x393216)")
    ap.add_argument("--dim", type=int, default=-1, help="the axis of the softmax (default: the last)")
    ap.add_argument("--dtypes", default=None, help="comma-separated (default: float32,bfloat16; with --device cpu "
                                                   "float32,float64,bfloat16)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: the CPU backend's sweep against numpy and torch's CPU kernel "
                         "(softlight/bench/cpu.py)")
    ap.add_argument("--op", default="forward",
                    choices=["forward", "backward", "cross_entropy", "token_logprobs", "entropy", "logsumexp",
                             "linear_cross_entropy", "hf_step"],
                    help="cross_entropy, token_logprobs, entropy, logsumexp: the consumers of the log-sum-exp against "
                         "their anchors over vocabularies (softlight/bench/consumers.py), on --device cuda or cpu; "
                         "linear_cross_entropy: the LM head with its loss against the bare GEMMs and the anchors, "
                         "--shapes NxDxV (softlight/bench/linear.py); hf_step: a Hugging Face Llama's training step "
                         "as it comes and patched, --shapes BxT")
    ap.add_argument("--vocabs", default="", help="with a consumer --op: comma-separated vocabulary sizes (default: "
                                                 "32000,50257,128256,151936,262144)")
    ap.add_argument("--vocab-parallel", action="store_true",
                    help="under torchrun: softlight.vocab_parallel over the ranks against one rank and plain torch "
                         "(softlight/bench/vocab_parallel.py); every consumer op and log_softmax, or the --op given; "
                         "--shapes are the whole logits (default 8192x128256,8192x262144; 64x32000 on the CPU)")
    ap.add_argument("--sweep", action="store_true",
                    help=f"instead of --shapes: rows x cols for cols in {SWEEP_COLS}, each tensor about "
                         f"--sweep-gb GB")
    ap.add_argument("--sweep-gb", type=float, default=1.0)
    ap.add_argument("--host", action="store_true",
                    help="instead: the host time of one call at 8 x 1000 float32 on the GPU, softlight's entries "
                         "and torch.log_softmax side by side (median of --passes rounds of 2000 calls)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=None,
                    help="timed calls a provider and pass (default: 30; 10 for linear_cross_entropy; 5 on the CPU)")
    ap.add_argument("--passes", type=int, default=1,
                    help="rounds of timing over all providers; each result is the median of its rounds")
    ap.add_argument("--providers", default="", help="comma-separated subset (copy is always timed)")
    ap.add_argument("--no-torch", action="store_true", help="do not use torch even if installed")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--compile", default="static", choices=["static", "dynamic"],
                    help="torch.compile compiled afresh for each shape (static, the default) or once a dim "
                         "with dynamic=True")
    ap.add_argument("--out-dir", default="softlight-bench",
                    help="where the JSON and PNG go (default: a folder softlight-bench in the working directory; "
                         "'' for none; the repository's own figures are written with --out-dir docs/perf)")
    ap.add_argument("--name", default="", help="the result files' name: <out-dir>/<name>.json and .png (default: "
                                               "host, sweep, backward or forward, by what is measured)")
    ap.add_argument("--commit", default=None, help="commit to record (default: git rev-parse HEAD)")
    args = ap.parse_args(argv)
    consumer = args.op in ("cross_entropy", "token_logprobs", "entropy", "logsumexp")
    vp_name = "vocab-parallel" + ("-cpu" if args.device == "cpu" else "")
    linear = args.op in ("linear_cross_entropy", "hf_step")
    args.name = args.name or (vp_name if args.vocab_parallel else f"{args.op}-cpu" if (consumer or linear) and
                              args.device == "cpu"
                              else args.op if consumer or linear
                              else "cpu" if args.device == "cpu" else "host" if args.host else "sweep" if args.sweep
                              else args.op)
    args.reps = args.reps if args.reps is not None else 5 if args.device == "cpu" else 10 if linear else 30
    if args.passes < 1 or args.reps < 1 or args.warmup < 0:
        raise SystemExit("softlight bench: --passes and --reps must be at least 1, --warmup at least 0")

    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("# torch not installed: timing softlight and the copy only", file=sys.stderr)
    if args.vocab_parallel:
        if torch is None or (args.device == "cuda" and not torch.cuda.is_available()):
            raise SystemExit("softlight bench --vocab-parallel: needs torch, and a GPU unless --device cpu")
        from . import vocab_parallel
        if args.op not in ("forward",) + vocab_parallel.OPS:
            raise SystemExit(f"softlight bench --vocab-parallel: times {', '.join(vocab_parallel.OPS)} "
                             f"(every one without --op); not --op {args.op}")
        return vocab_parallel.run(args, argv, torch, args.commit or git_commit())
    if linear:
        if torch is None:
            raise SystemExit("softlight bench --op linear_cross_entropy: needs torch")
        if args.device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("softlight bench: no CUDA GPU is visible; pass --device cpu")
        from . import linear as linear_bench
        run = linear_bench.run_hf_step if args.op == "hf_step" else linear_bench.run
        return run(args, argv, torch, args.commit or git_commit())
    if consumer:
        if torch is None:
            raise SystemExit(f"softlight bench --op {args.op}: needs torch (the anchors and the arrays)")
        if args.device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("softlight bench: no CUDA GPU is visible; pass --device cpu")
        from . import consumers
        return consumers.run(args, argv, torch, args.commit or git_commit())
    if args.device == "cpu":
        if args.op != "forward" or args.sweep or args.host:
            raise SystemExit("softlight bench --device cpu: times the forward (the CPU backend's sweep, or --shapes "
                             "along --dim) and the consumer --op values; not "
                             + ("--sweep" if args.sweep else "--host" if args.host else f"--op {args.op}"))
        from . import cpu
        return cpu.main(args, argv, torch, args.commit or git_commit())
    from . import forward
    return forward.run(args, argv, torch, args.commit or git_commit())

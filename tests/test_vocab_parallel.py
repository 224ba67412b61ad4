"""softlight.vocab_parallel over two gloo ranks on the CPU, and one NCCL rank on a GPU: the results and
gradients equal the single-process functions on the concatenated logits, and a float64 reference."""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

RANKS = 2


def _cases():
    """(name, shape of the full logits, dtype, special values) of each check."""
    return [("fp64", (13, 1002), torch.float64, False), ("fp32", (9, 32000), torch.float32, True),
            ("bf16", (7, 514), torch.bfloat16, False), ("3d", (2, 3, 64), torch.float32, True)]


def _full_inputs(shape, dtype, special, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 4).to(dtype)
    lead, vocab = shape[:-1], shape[-1]
    target = torch.randint(0, vocab, lead, generator=g)
    index = torch.randint(0, vocab, lead + (3,), generator=g)
    flat = target.reshape(-1)
    flat[0] = -100
    if special:
        xf = x.reshape(-1, vocab)
        xf[1, 5] = float("-inf")  # a -inf entry among finite ones
        xf[2, : vocab // 2] = float("-inf")  # the first shard of a row all -inf
    return x, target, index


def _worker(rank, path, results, backend="gloo", device="cpu", ranks=RANKS):
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=ranks)
    import softlight.torch as slt
    import softlight.vocab_parallel as vp
    out = {}
    for seed, (name, shape, dtype, special) in enumerate(_cases()):
        x, target, index = (a.to(device) for a in _full_inputs(shape, dtype, special, seed))
        width = shape[-1] // ranks
        shard = x[..., rank * width:(rank + 1) * width].clone().requires_grad_()
        full = x.clone().requires_grad_()
        for T in (1.0, 0.7):
            got = {
                "ce": vp.cross_entropy(shard.reshape(-1, width), target.reshape(-1), label_smoothing=0.1,
                                       z_loss=1e-3, temperature=T),
                "ce_none": vp.cross_entropy(shard.reshape(-1, width), target.reshape(-1), reduction="none",
                                            temperature=T),
                "lp": vp.token_logprobs(shard, index, temperature=T),
                "lp1": vp.token_logprobs(shard, target.clamp(min=0), temperature=T),
                "h": vp.entropy(shard, temperature=T),
                "lse": vp.logsumexp(shard, temperature=T),
                "ls": vp.log_softmax(shard, temperature=T),
            }
            want = {
                "ce": slt.cross_entropy(full.reshape(-1, shape[-1]), target.reshape(-1), label_smoothing=0.1,
                                        z_loss=1e-3, temperature=T),
                "ce_none": slt.cross_entropy(full.reshape(-1, shape[-1]), target.reshape(-1), reduction="none",
                                             temperature=T),
                "lp": slt.token_logprobs(full, index, temperature=T),
                "lp1": slt.token_logprobs(full, target.clamp(min=0), temperature=T),
                "h": slt.entropy(full, temperature=T),
                "lse": slt.logsumexp(full / T) if T != 1.0 else slt.logsumexp(full),
                "ls": slt.log_softmax(full, temperature=T)[..., rank * width:(rank + 1) * width],
            }
            for key in got:
                w = torch.randn(got[key].shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
                w = w.to(device)
                finite = torch.isfinite(want[key].detach().double()) & torch.isfinite(got[key].detach().double())
                gs, = torch.autograd.grad((got[key].double() * w)[finite].sum(), shard)
                if key == "ls":
                    # Each rank's loss is its own shard's; the gradient is that of their sum, the
                    # full output against the weights of every rank (the same on each) side by side.
                    whole = slt.log_softmax(full, temperature=T).double()
                    wf = torch.cat([w] * ranks, -1)
                    gf, = torch.autograd.grad((whole * wf)[torch.isfinite(whole)].sum(), full)
                else:
                    gf, = torch.autograd.grad((want[key].double() * w)[finite].sum(), full)
                gf = gf[..., rank * width:(rank + 1) * width]
                out[(name, T, key)] = tuple(a.detach().double().cpu() for a in (got[key], want[key], gs, gf))
    results[rank] = out
    dist.destroy_process_group()


def _spawn(ranks, *args):
    with tempfile.TemporaryDirectory() as tmp:
        manager = mp.Manager()
        results = manager.dict()
        mp.spawn(_worker, args=(os.path.join(tmp, "store"), results) + args, nprocs=ranks, join=True)
        return dict(results)


@pytest.fixture(scope="module")
def ranks_results():
    return _spawn(RANKS)


# Rounding of the merged statistics against one pass over the whole row (accumulation type).
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 2e-2}


def _compare(results, ranks, case):
    name, _, dtype, _ = case
    tol = TOL[dtype]
    checked = 0
    for rank in range(ranks):
        for (n, T, key), (got, want, gs, gf) in results[rank].items():
            if n != name:
                continue
            # Same special values (NaN where one has NaN, the same infinities), then close values.
            assert torch.equal(torch.isnan(got), torch.isnan(want)), (n, T, key)
            fin = torch.isfinite(want)
            assert torch.equal(got[~fin & ~torch.isnan(want)], want[~fin & ~torch.isnan(want)]), (n, T, key)
            assert torch.allclose(got[fin], want[fin], rtol=tol, atol=tol), (n, T, key, (got - want)[fin].abs().max())
            assert not torch.isnan(gf).any() and not torch.isnan(gs).any(), (n, T, key)
            assert torch.allclose(gs, gf, rtol=tol, atol=tol), (n, T, key, (gs - gf).abs().max())
            checked += 1
    assert checked == ranks * 2 * 7


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_vocab_parallel_equals_one_process(ranks_results, case):
    _compare(ranks_results, RANKS, case)


_NCCL = torch.cuda.is_available() and dist.is_nccl_available()


@pytest.mark.skipif(not _NCCL, reason="no CUDA GPU, or torch has no NCCL")
def test_nccl_one_rank_equals_the_plain_functions():
    """The NCCL path on one GPU, one rank holding the whole vocabulary: the GPU kernels' statistics
    through an NCCL all-gather equal the plain functions."""
    results = _spawn(1, "nccl", "cuda", 1)
    for case in _cases():
        _compare(results, 1, case)


def _misuse_worker(rank, path, results, backend="gloo", device="cpu", ranks=RANKS):
    """What each rank gets from shards of unequal widths, explicit starts, and a token outside the
    vocabulary (after a first call has found the widths equal); on a GPU, the same calls again with
    every synchronizing CUDA call made an error."""
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=ranks)
    import softlight.torch as slt
    import softlight.vocab_parallel as vp
    from softlight import InvalidArgumentError
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 12, generator=g, dtype=torch.float64).to(device)
    t = torch.randint(0, 12, (6,), generator=g).to(device)
    t[4] = -100
    out = {}
    if ranks == 2:
        lo, width = (0, 5) if rank == 0 else (5, 7)
        shard = x[:, lo:lo + width].clone()
        try:
            vp.cross_entropy(shard, t)
            out["unequal"] = None
        except InvalidArgumentError as e:
            out["unequal"] = str(e)
        out["explicit"] = (float(vp.cross_entropy(shard, t, vocab_start=lo)), float(slt.cross_entropy(x, t)))
    width = 12 // ranks
    eq = x[:, rank * width:(rank + 1) * width].clone().requires_grad_()
    out["first"] = float(vp.cross_entropy(eq, t))
    bad = t.clone()
    bad[2] = 12
    try:
        out["outside"] = vp.token_logprobs(eq, bad.clamp(min=0)).detach().cpu()
        out["outside_ce"] = float(vp.cross_entropy(eq, bad))
    except InvalidArgumentError as e:
        out["outside"] = str(e)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        loss = vp.cross_entropy(eq, t, check=False)
        loss.backward()
        lp = vp.token_logprobs(eq, t.clamp(min=0), check=False)
        torch.cuda.set_sync_debug_mode(0)
        out["unsynced"] = (float(loss), lp.detach().cpu())
    results[rank] = out
    dist.destroy_process_group()


def _spawn_misuse(ranks, *args):
    with tempfile.TemporaryDirectory() as tmp:
        results = mp.Manager().dict()
        mp.spawn(_misuse_worker, args=(os.path.join(tmp, "store"), results) + args, nprocs=ranks, join=True)
        return dict(results)


def test_vocab_parallel_misuse_on_the_cpu():
    """Unequal shards without vocab_start are refused on every rank, and work with it; a token
    outside the vocabulary is refused on every rank, also once the widths are known equal."""
    results = _spawn_misuse(RANKS)
    for rank in range(RANKS):
        r = results[rank]
        assert r["unequal"] is not None and "widths [5, 7]" in r["unequal"], r["unequal"]
        got, want = r["explicit"]
        assert abs(got - want) <= 1e-12 * abs(want), (got, want)
        assert isinstance(r["outside"], str) and "(12) is outside the vocabulary [0, 12)" in r["outside"], r["outside"]


@pytest.mark.skipif(not _NCCL, reason="no CUDA GPU, or torch has no NCCL")
def test_vocab_parallel_on_a_gpu_never_waits_for_it():
    """One NCCL rank: with check=False (the ranks' agreement not checked), cross-entropy forward and
    backward and token log-probs make no synchronizing CUDA call (torch's sync debug mode as an error), and a token
    outside the vocabulary gives NaN, as the single-device functions on a GPU."""
    r = _spawn_misuse(1, "nccl", "cuda", 1)[0]
    lp = r["outside"]
    assert not isinstance(lp, str), lp
    assert torch.isnan(lp[2]) and torch.isfinite(lp[torch.arange(6) != 2]).all(), lp
    assert r["outside_ce"] != r["outside_ce"]  # NaN
    loss, lp = r["unsynced"]
    assert abs(loss - r["first"]) <= 1e-12 * abs(loss) and torch.isfinite(lp).all()


def test_vocab_parallel_matches_float64_reference(ranks_results):
    """The single-process side itself against float64 torch, for the float64 case."""
    x, target, index = _full_inputs((13, 1002), torch.float64, False, 0)
    lse = torch.logsumexp(x, -1)
    for rank in range(RANKS):
        got, want, _, _ = ranks_results[rank][("fp64", 1.0, "lse")]
        assert torch.allclose(got, lse, rtol=1e-12, atol=1e-12)
        got, _, _, _ = ranks_results[rank][("fp64", 1.0, "lp")]
        assert torch.allclose(got, torch.log_softmax(x, -1).gather(-1, index), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device,ranks", [("cpu", 2), pytest.param("cuda", 1, marks=pytest.mark.skipif(
    not _NCCL, reason="no CUDA GPU, or torch has no NCCL"))])
def test_bench_over_ranks(tmp_path, device, ranks):
    """`torchrun -m softlight bench --vocab-parallel`, as a user runs it (two gloo ranks on the CPU, one
    NCCL rank on a GPU): every provider of every op checked against the single-device functions on the
    whole logits (the plain-torch forms too), timed, and written with its ranks."""
    import json
    import subprocess
    import sys
    from softlight.bench.vocab_parallel import OPS
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), "-m",
           "softlight", "bench", "--vocab-parallel", "--device", device, "--shapes", "16x1000,6x514",
           "--dtypes", "float32,bfloat16", "--reps", "1", "--out-dir", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    name = "vocab-parallel" + ("-cpu" if device == "cpu" else "")
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    assert doc["meta"]["ranks"] == ranks
    rows = {(w["op"], w["provider"], w["dtype"], w["shape"][1]): w for w in doc["rows"]}
    for op in OPS:
        for prov in ("copy", "softlight", "one-rank", "torch-vp") + (("all_gather",) if op == "cross_entropy" else ()):
            for dtype in ("float32", "bfloat16"):
                for vocab in (1000, 514):
                    w = rows[(op, prov, dtype, vocab)]
                    assert w["status"] == "ok" and w["ms"] > 0, w
                    assert w["ranks"] == ranks and w["shard"] == [w["shape"][0], vocab // ranks], w
    assert len(doc["rows"]) == 2 * 2 * (4 * 4 + 1)
    from test_bench_tools import test_committed_results_follow_the_schema
    test_committed_results_follow_the_schema(tmp_path / f"{name}.json")


def test_bench_check_finds_wrong_results():
    """The benches' check (softlight.bench.consumers.check, which the vocab-parallel bench uses too): equal values
    and (loss, gradient) pairs pass, a wrong value, loss or gradient does not."""
    from softlight.bench.consumers import check
    x, g, one = torch.randn(4, 10), torch.randn(4, 10), torch.tensor(1.0)
    assert check(torch, "entropy", x, x.clone(), None, "float32") is None
    assert check(torch, "entropy", x + 1e-2, x, None, "float32").startswith("wrong (")
    assert check(torch, "cross_entropy", (one, g), one.clone(), g.clone(), "float32") is None
    assert check(torch, "cross_entropy", (one * 1.01, g), one, g, "float32").startswith("wrong loss")
    assert check(torch, "cross_entropy", (one, g * 1.01), one, g, "float32").startswith("wrong gradient")


def _contract_worker(rank, path, results, ranks=RANKS):
    """Each rank's answer (the error's text, or None) to calls whose ranks do not go together, and the
    log-softmax over a split vocabulary on logits with a large common offset and a tiny temperature."""
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=ranks)
    import softlight.vocab_parallel as vp
    from softlight import SoftlightError
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 12, generator=g, dtype=torch.float64)
    t = torch.randint(0, 12, (6,), generator=g)
    out = {}

    def outcome(fn):
        try:
            fn()
            return None
        except SoftlightError as e:
            return f"{type(e).__name__}: {e}"

    shard = x[:, rank * 6:(rank + 1) * 6].clone()
    out["overlap"] = outcome(lambda: vp.cross_entropy(shard, t, vocab_start=0))  # both ranks start at 0
    out["gap"] = outcome(lambda: vp.cross_entropy(shard, t, vocab_start=0 if rank == 0 else 7))
    out["equal"] = outcome(lambda: vp.cross_entropy(shard, t))
    # A later call with unequal widths (no stale cache: both ranks raise).
    uneven = x[:, :5].clone() if rank == 0 else x[:, 5:].clone()
    out["later_unequal"] = outcome(lambda: vp.cross_entropy(uneven, t))
    # Different row counts reach no collective: the same error on both ranks.
    rows = shard[: 6 - rank]
    out["rows"] = outcome(lambda: vp.cross_entropy(rows, t[: 6 - rank]))
    out["float_target"] = outcome(lambda: vp.cross_entropy(shard, t.double() + 0.7))
    # log_softmax: offset 1e4 and temperature 1e-37 (float32), against the single-device kernel.
    import softlight.torch as slt
    full = (torch.randn(4, 12, generator=g) + 1e4).float()
    mine = full[:, rank * 6:(rank + 1) * 6].clone()
    for T in (1.0, 1e-37):
        got = vp.log_softmax(mine, temperature=T)
        want = slt.log_softmax(full, temperature=T)[:, rank * 6:(rank + 1) * 6]
        out[("ls", T)] = (got, want)
    results[rank] = out
    dist.destroy_process_group()


def test_vocab_parallel_ranks_must_go_together():
    """Shards that overlap or leave a gap, unequal widths on a later call, unequal row counts and float
    targets: every rank raises the same SoftlightError, on every call (nothing cached); the split
    log-softmax keeps the single-device precision at a large offset and a tiny temperature."""
    with tempfile.TemporaryDirectory() as tmp:
        results = mp.Manager().dict()
        mp.spawn(_contract_worker, args=(os.path.join(tmp, "store"), results), nprocs=RANKS, join=True)
        results = dict(results)
    a, b = results[0], results[1]
    assert a["equal"] is None and b["equal"] is None
    for key, words in (("overlap", "they overlap"), ("gap", "a gap"), ("later_unequal", "widths [5, 7]"),
                       ("rows", "rows differ"), ("float_target", "not probabilities")):
        assert a[key] is not None and words in a[key], (key, a[key])
        assert a[key] == b[key], (key, a[key], b[key])
    for rank in range(RANKS):
        for T in (1.0, 1e-37):
            got, want = results[rank][("ls", T)]
            assert not torch.isnan(got).any(), (T, got)
            assert torch.allclose(got, want, rtol=1e-6, atol=2e-6), (T, (got - want).abs().max())


def _weights(loss):
    """Unequal upstream gradients for a loss, on its device."""
    return torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype, device=loss.device).reshape(loss.shape)


def _head_worker(rank, path, results, backend="gloo", device="cpu", ranks=RANKS):
    """The LM head over a weight split by vocabulary: each rank's loss, statistics and gradients against
    one process's over the whole weight (float64), for a few options, and an uneven split (explicit
    vocab_start)."""
    dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=ranks)
    import softlight.torch as slt
    import softlight.vocab_parallel as vp
    g = torch.Generator().manual_seed(11)
    vocab, d = 301, 16
    h = torch.randn(2, 9, d, generator=g, dtype=torch.float64).to(device)
    w = (torch.randn(vocab, d, generator=g, dtype=torch.float64) / 4).to(device)
    b = torch.randn(vocab, generator=g, dtype=torch.float64).to(device)
    t = torch.randint(0, vocab, (2, 9), generator=g).to(device)
    t[0, 3] = -100
    idx = torch.randint(0, vocab, (2, 9, 3), generator=g).to(device)
    cuts = [0, 120, vocab] if ranks == 2 else [0, vocab]  # uneven: 120 and 181 words
    lo, hi = cuts[rank], cuts[rank + 1]
    out = {}
    for name, opts in (("plain", {}), ("smooth", dict(label_smoothing=0.1, z_loss=1e-3, temperature=0.7)),
                       ("cap", dict(softcap=2.0, shift=True)), ("none", dict(reduction="none"))):
        hs, ws, bs = (a.clone().requires_grad_() for a in (h, w[lo:hi], b[lo:hi]))
        loss = vp.linear_cross_entropy(hs, ws, t, bias=bs, vocab_start=lo, **opts)
        (loss * _weights(loss)).sum().backward()
        hf, wf, bf = (a.clone().requires_grad_() for a in (h, w, b))
        want = slt.linear_cross_entropy(hf, wf, t, bias=bf, **opts)
        (want * _weights(want)).sum().backward()
        out[name] = [(a.detach().cpu(), r.detach().cpu()) for a, r in
                     ((loss, want), (hs.grad, hf.grad), (ws.grad, wf.grad[lo:hi]), (bs.grad, bf.grad[lo:hi]))]
    hs, ws = h.clone().requires_grad_(), w[lo:hi].clone().requires_grad_()
    st = vp.linear_row_stats(hs, ws, idx, vocab_start=lo, temperature=0.8)
    (st["logprobs"].sum() + 2 * st["entropy"].sum()).backward()
    hf, wf = h.clone().requires_grad_(), w.clone().requires_grad_()
    sf = slt.linear_row_stats(hf, wf, idx, temperature=0.8)
    (sf["logprobs"].sum() + 2 * sf["entropy"].sum()).backward()
    out["stats"] = [(a.detach().cpu(), r.detach().cpu()) for a, r in
                    ((st["logprobs"], sf["logprobs"]), (st["entropy"], sf["entropy"]), (hs.grad, hf.grad),
                     (ws.grad, wf.grad[lo:hi]))]
    results[rank] = out
    dist.destroy_process_group()


def _check_head(results, ranks):
    for rank in range(ranks):
        assert set(results[rank]) == {"plain", "smooth", "cap", "none", "stats"}
        for name, pairs in results[rank].items():
            for i, (a, r) in enumerate(pairs):
                assert a.shape == r.shape and torch.isfinite(a).all(), (rank, name, i)
                assert torch.allclose(a, r, rtol=1e-10, atol=1e-12), (rank, name, i, (a - r).abs().max())


def test_vocab_parallel_lm_head_equals_one_process():
    with tempfile.TemporaryDirectory() as tmp:
        results = mp.Manager().dict()
        mp.spawn(_head_worker, args=(os.path.join(tmp, "store"), results), nprocs=RANKS, join=True)
        _check_head(dict(results), RANKS)


@pytest.mark.skipif(not _NCCL, reason="no CUDA GPU, or torch has no NCCL")
def test_vocab_parallel_lm_head_nccl_one_rank():
    with tempfile.TemporaryDirectory() as tmp:
        results = mp.Manager().dict()
        mp.spawn(_head_worker, args=(os.path.join(tmp, "store"), results, "nccl", "cuda", 1), nprocs=1, join=True)
        _check_head(dict(results), 1)

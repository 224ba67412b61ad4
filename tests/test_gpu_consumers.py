"""The consumers of the log-sum-exp on the GPU: row statistics and their gradient against the float64
references of the CPU tests (test_consumers.py), cross-entropy against torch, layouts, in place,
special values, torch.compile on the GPU, CuPy arrays, and the CPU's results on the same inputs."""
import numpy as np
import pytest

import paths
from gpu_util import HAVE_GPU, needs_gpu, on_path, tdtype, torch
from reference import TOL

pytestmark = needs_gpu

if HAVE_GPU:
    import softlight
    import softlight.torch as slt
    from test_consumers import stats_ref

CODES = ["float32", "float16", "bfloat16", "float64"]


def _logits(shape, dtype, special, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 4
    if special and shape[0] >= 6 and shape[1] >= 2:
        x[1, shape[1] // 2] = -float("inf")
        x[2, :] = -float("inf")
        x[3, -1] = float("nan")
        x[4, 0] = float("inf")
        x[5, :] = -50.0
    return x.to(tdtype(dtype))


def _check(got, ref, dtype, what, scale=None):
    got = got.detach().double().cpu().numpy()
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), what
    inf = np.isinf(ref)
    assert np.array_equal(got[inf], ref[inf]), what
    fin = np.isfinite(ref)
    atol, rtol = TOL["float64" if dtype == "float64" else "float32"]
    # The GPU's exp is ex2.approx (relative 2^-22) for float: a few ulps more than the CPU's.
    if dtype != "float64":
        atol, rtol = 4 * atol, 4 * rtol
    lim = atol + rtol * (np.abs(ref[fin]) if scale is None else np.broadcast_to(scale, ref.shape)[fin])
    err = np.abs(got[fin] - ref[fin])
    assert (err <= lim).all(), f"{what}: error {err.max():.3e}"


def _check_loss(loss, want, dtype, what):
    """A loss against float64: a float16 or bfloat16 loss (softlight.torch.cross_entropy returns it in
    the logits' dtype, as torch does) within one rounding of the float64 value rounded to its dtype."""
    if loss.dtype not in (torch.float16, torch.bfloat16):
        return _check(loss, want, dtype, what)
    w = torch.as_tensor(want).to(loss.dtype).double().cpu().numpy()
    got = loss.detach().double().cpu().numpy()
    assert np.array_equal(np.isnan(got), np.isnan(w)), what
    assert np.array_equal(got[np.isinf(w)], w[np.isinf(w)]), what
    fin = np.isfinite(w)
    err = np.abs(got[fin] - w[fin])
    assert (err <= torch.finfo(loss.dtype).eps * np.abs(w[fin]) + 1e-30).all(), f"{what}: error {err.max():.3e}"


SHAPES = [(1, 1), (9, 7), (17, 1000), (6, 5001), (3, 128256), (64, 32000)]


@pytest.mark.parametrize("dtype", CODES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_row_stats_match_float64(dtype, shape):
    rows, cols = shape
    for seed, (temperature, special, k) in enumerate(((1.0, True, 1), (0.37, False, 4), (3.0, True, 2))):
        x = _logits(shape, dtype, special, seed)
        index = torch.randint(0, cols, (rows, k), generator=torch.Generator().manual_seed(seed))
        st = slt.row_stats(x.cuda(), index.cuda(), temperature=temperature)
        ref = stats_ref(x.double().numpy() / temperature, index.numpy())
        what = f"{dtype} {shape} T={temperature}"
        for s in ("lse", "logprobs", "picked"):
            _check(st[s], ref[s], dtype, f"{what} {s}")
        _check(st["entropy"], ref["entropy"], dtype, f"{what} entropy", 1.0 + np.abs(ref["lse"]))
        with np.errstate(all="ignore"):
            _check(st["sum"], ref["sum"], dtype, f"{what} sum", np.abs(x.double().numpy() / temperature).sum(-1))
        # The same as the CPU backend's, within the float tolerance.
        cpu = slt.row_stats(x, index, temperature=temperature)
        for s in ("lse", "entropy", "logprobs"):
            a, b = st[s].cpu().double(), cpu[s].double()
            assert torch.equal(a.isnan(), b.isnan()), (what, s)


def _grad_args(x, tokens, seed):
    """lse and row_stats_backward's other arguments (on the CPU) for x: no token (nothing but p's
    terms); one a row, (rows,), from a shard of the vocabulary (row 0's token lies before it: no term);
    or `tokens` a row, row 0's second the same as its first."""
    rows, cols = x.shape
    g = torch.Generator().manual_seed(seed)
    index, offset, shard, per = None, 0, False, ()
    if tokens == 1:  # the shard holds tokens 1000 .. 1000 + cols - 1
        index, offset, shard = torch.randint(0, cols, (rows,), generator=g) + 1000, 1000, True
        index[0] = 5
    elif tokens > 1:
        index, per = torch.randint(0, cols, (rows, tokens), generator=g), (tokens,)
        index[0, 1] = index[0, 0]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    st = softlight.row_stats(x, index, stats=("lse", "entropy"), temperature=0.8, index_offset=offset, shard=shard)
    d = {n: torch.randn(s, generator=g, dtype=acc) for n, s in
         (("d_lse", (rows,)), ("d_entropy", (rows,)), ("d_logprobs", (rows,) + per), ("d_picked", (rows,) + per),
          ("d_sum", (rows,)))}
    if index is None:
        del d["d_logprobs"], d["d_picked"]
    return st, dict(entropy=st["entropy"], index=index, temperature=0.8, index_offset=offset, shard=shard, **d)


def _same_gradient(want, got, st, dtype):
    """The GPU's gradient `got` against the CPU's `want`: within the tolerance where the row's
    statistics are finite, NaN where the CPU's is."""
    fine = torch.isfinite(st["lse"]) & torch.isfinite(st["entropy"])
    w, v = want[fine].double(), got.cpu()[fine].double()
    atol, rtol = TOL[dtype]
    assert ((w - v).abs() <= 4 * (atol + rtol * (w.abs() + 1))).all(), (dtype, (w - v).abs().max())
    assert torch.equal(want[~fine].isnan(), got.cpu()[~fine].isnan()), dtype


@pytest.mark.parametrize("dtype", CODES)
@pytest.mark.parametrize("shape", [(9, 7), (17, 1000), (4, 5001), (7, 128256)], ids=str)
@pytest.mark.parametrize("tokens", [0, 1, 3])
@pytest.mark.parametrize("in_place", [False, True])
def test_row_stats_backward_matches_cpu(dtype, shape, tokens, in_place):
    """The GPU's gradient against the CPU backend's on the same inputs (the CPU's is checked against
    float64 in test_consumers.py), every coefficient set (_grad_args). In place: the same bits as into
    a new array. With no token or one: the flat pass, rows of 5001 and 7 with packs across their ends
    (rows of 7 in 16-bit types are shorter than a pack: a CTA a row); with three, a CTA a row."""
    x = _logits(shape, dtype, True, 11)
    st, args = _grad_args(x, tokens, 12)
    cuda = {n: v.cuda() if torch.is_tensor(v) else v for n, v in args.items()}
    want = softlight.row_stats_backward(x, st["lse"], **args)
    got = softlight.row_stats_backward(x.cuda(), st["lse"].cuda(), **cuda)
    _same_gradient(want, got, st, dtype)
    if in_place:
        xc = x.cuda()
        out = softlight.row_stats_backward(xc, st["lse"].cuda(), out=xc, **cuda)
        assert out is xc
        assert torch.equal(out.cpu().view(torch.uint8), got.cpu().view(torch.uint8))


@pytest.mark.parametrize("dtype", CODES)
@pytest.mark.parametrize("layout, tokens", [("x and dx off a boundary", 1), ("x and dx off a boundary", 0),
                                            ("x and dx off a boundary", 2), ("dx off x's boundary", 1),
                                            ("rows apart", 1)])
def test_row_stats_backward_layouts(dtype, layout, tokens):
    """Each way the gradient is taken (consumer_rows.cu): the flat pass over rows back to back at the
    same place in a pack (its elements before the first boundary one by one), with one token a row or
    none; else a CTA a row (two tokens, dx at another place in a pack than x, rows apart)."""
    rows, cols = 6, 3001
    base = _logits((rows, cols), dtype, True, 31)
    st, args = _grad_args(base, tokens, 32)
    want = softlight.row_stats_backward(base, st["lse"], **args)
    cuda = {n: v.cuda() if torch.is_tensor(v) else v for n, v in args.items()}
    lse = st["lse"].cuda()

    def at(t, skip):  # t's values, contiguous, `skip` elements past a 256-byte boundary
        buf = torch.full((t.numel() + skip,), float("nan"), dtype=t.dtype, device="cuda")
        v = buf[skip:].view(t.shape)
        v.copy_(t)
        return v
    if layout == "rows apart":
        x = torch.full((rows, cols + 5), float("nan"), dtype=base.dtype, device="cuda")[:, :cols]
        x.copy_(base)
        out = None
    else:
        x = at(base, 1)
        out = at(torch.full_like(base, float("nan")), 1 if layout == "x and dx off a boundary" else 0)
    got = softlight.row_stats_backward(x, lse, out=out, **cuda)
    _same_gradient(want, got, st, dtype)
    if layout == "x and dx off a boundary":  # and in place: the same bits
        assert torch.equal(softlight.row_stats_backward(x, lse, out=x, **cuda).cpu().view(torch.uint8),
                           got.cpu().view(torch.uint8))


@pytest.mark.parametrize("dtype", CODES)
@pytest.mark.parametrize("skip", [1, 3])
def test_rows_off_a_16_byte_boundary(dtype, skip):
    """Rows that start inside a 16-byte pack (a view from column `skip` on, rows of odd length): the
    kernels take the elements before the row's first boundary one by one, then packs; a gradient
    buffer whose rows lie otherwise than x's goes element by element."""
    full = _logits((9, 4000 + skip + 1), dtype, True, 21).cuda()
    x = full[:, skip:]
    rows, cols = x.shape
    index = torch.randint(0, cols, (rows, 2), generator=torch.Generator().manual_seed(22))
    st = slt.row_stats(x, index.cuda(), temperature=0.7)
    ref = stats_ref(x.double().cpu().numpy() / 0.7, index.numpy())
    for s in ("lse", "logprobs"):
        _check(st[s], ref[s], dtype, f"{dtype} skip={skip} {s}")
    _check(st["entropy"], ref["entropy"], dtype, f"{dtype} skip={skip} entropy", 1.0 + np.abs(ref["lse"]))
    t = index[:, 0].cuda()
    fine = torch.isfinite(x.double()).all(-1)
    v = x.detach().requires_grad_()
    loss = slt.cross_entropy(v, t, reduction="none")
    x64 = v.detach().double().requires_grad_()
    want = torch.nn.functional.cross_entropy(x64, t, reduction="none")
    _check_loss(loss[fine], want[fine].detach().cpu().numpy(), dtype, f"{dtype} skip={skip} loss")
    gx, = torch.autograd.grad(loss[fine].sum(), v)
    wx, = torch.autograd.grad(want[fine].sum(), x64)
    atol, rtol = TOL[dtype]
    err = (gx.double() - wx)[fine].abs()
    assert (err <= 4 * (atol + rtol)).all(), (dtype, skip, err.max().item())


def _on_chip(rows, cols, dtype, consumer=True):
    """Where cross-entropy holds rows of x and a fresh gradient (both contiguous) on chip, as the
    planner says on this GPU (consumer=False: where the log-softmax holds x's rows): "registers"
    (a group of lanes', short rows' or a cluster's), "tiles" (flat_rows'), "ring" (cluster_rows), or
    None."""
    import gpu_util
    e = torch.empty((), dtype=tdtype(dtype)).element_size()
    prob = paths.rows_problem(rows, cols, e, peelable=True)
    dev = gpu_util.device_plan_args()
    if not consumer:
        return paths.on_chip(gpu_util.plan(prob.pop("rows"), prob.pop("cols"), prob.pop("elem_bytes"),
                                           prob.pop("aligned16"), **prob, **dev), e)
    return paths.on_chip(gpu_util._planner().plan_consumer(dict(prob, cross_entropy=True, writes_grad=True), dev), e)


@pytest.mark.parametrize("dtype, shape", paths.STATS_IN_REGISTERS, ids=str)
def test_row_stats_in_registers(dtype, shape):
    """Rows of at most 128 KiB that the log-softmax holds on chip, a group of lanes', short rows',
    flat tiles' or a cluster's (asserted from the planner), give every statistic but the row's sum
    from there (rows off 16 bytes from the second row on, 32001, 16001 and 5001 columns: peeled);
    longer ones (two cases) take consumer_rows.cu's kernel (kStatsClusterRowBytes,
    src/families/consumer_rows/rule.hpp). Either way: lse, entropy, max,
    sumexp, moment, and picked and logprobs of 1 and 3 tokens, against float64, with special values,
    T = 1 and 0.6, and a shard's tokens (outside it: 0); max, sumexp and moment against
    consumer_rows.cu's kernel, which asking the sum too takes; the entropy alone (the entropy
    function's call) as with the rest."""
    rows, cols = shape
    on_path(_on_chip(rows, cols, dtype, consumer=False) in ("registers", "tiles"), f"{shape} {dtype} on chip")
    want = ("lse", "entropy", "max", "sumexp", "moment", "picked", "logprobs")
    for seed, (T, k, shard) in enumerate(((1.0, 1, False), (0.6, 3, False), (1.0, 2, True))):
        x = _logits(shape, dtype, True, 41 + seed)
        if dtype != "float16":
            x[6] *= 1e10  # a row past the exp's split of its max (packs.cuh, shifted_exp)
        index = torch.randint(0, cols, (rows, k), generator=torch.Generator().manual_seed(42 + seed))
        offset = 0
        if shard:  # the shard holds tokens 1000 .. 1000 + cols - 1; token 5 of row 0 lies before it
            offset = 1000
            index += offset
            index[0, 0] = 5
        st = softlight.row_stats(x.cuda(), index.cuda(), stats=want, temperature=T, index_offset=offset, shard=shard)
        z = x.double().numpy() / T
        ref = stats_ref(z, np.clip(index.numpy() - offset, 0, cols - 1))
        what = f"{dtype} {shape} T={T} k={k} shard={shard}"
        outside = (index.numpy() < offset) | (index.numpy() >= offset + cols)
        for s in ("picked", "logprobs"):
            ref[s] = np.where(outside, 0.0, ref[s])
        for s in ("lse", "picked", "logprobs"):
            _check(st[s], ref[s], dtype, f"{what} {s}")
        _check(st["entropy"], ref["entropy"], dtype, f"{what} entropy", 1.0 + np.abs(ref["lse"]))
        alone = softlight.row_stats(x.cuda(), stats=("entropy",), temperature=T)["entropy"]
        assert torch.allclose(alone, st["entropy"], rtol=0, atol=0, equal_nan=True), what
        # max, sumexp and moment as consumer_rows.cu's kernel gives them (asking the sum too takes it).
        other = softlight.row_stats(x.cuda(), index.cuda(), stats=want + ("sum",), temperature=T,
                                    index_offset=offset, shard=shard)
        for s in ("max", "sumexp"):
            _check(st[s], other[s].double().cpu().numpy(), dtype, f"{what} {s}")
        # The moment, a sum of terms up to |x - max| / T times the sumexp's: scaled by that.
        spread = np.nan_to_num(np.abs(z - np.nanmax(np.where(np.isinf(z), np.nan, z), -1, keepdims=True)), nan=0.0)
        _check(st["moment"], other["moment"].double().cpu().numpy(), dtype, f"{what} moment",
               np.abs(other["sumexp"].double().cpu().numpy()) * (1.0 + spread.max(-1)))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", paths.CE_ON_CHIP, ids=str)
def test_cross_entropy_on_chip(dtype, shape):
    """Rows the log-softmax holds on chip, in registers (a group of lanes', short rows' or a
    cluster's), flat tiles or cluster_rows' ring (asserted from the planner, fp32 and 16-bit rows;
    200003 and 5001 columns are peeled), write cross-entropy's gradient from there: loss, lse and
    gradient against
    torch in float64, with an ignored row, each reduction, z-loss, T = 1 and 0.6, and special values
    (NaN and 0 gradient rows)."""
    rows, cols, where32, where16 = shape
    shape = (rows, cols)
    where = where32 if dtype == "float32" else where16
    on_path(_on_chip(rows, cols, dtype) == where, f"{shape} {dtype} {'on chip: ' + where if where else 'off chip'}")
    t = torch.randint(0, cols, (rows,), generator=torch.Generator().manual_seed(32)).cuda()
    t[7] = -100
    t[1] = 0  # (row 1's -inf element is not its target)
    for seed, (T, reduction, z, special) in enumerate(((1.0, "none", 1e-3, True), (0.6, "mean", 0.0, False),
                                                       (1.0, "sum", 1e-4, False))):
        x0 = _logits(shape, dtype, special, 31 + seed).cuda()
        if special and dtype != "float16":
            x0[6] *= 1e10  # a row past the exp's split of its max (packs.cuh, shifted_exp)
        x = x0.detach().clone().requires_grad_()
        loss, lse = slt.cross_entropy(x, t, reduction=reduction, z_loss=z, temperature=T, return_lse=True)
        x64 = x0.detach().double().requires_grad_()
        z64 = x64 / T
        want_lse = torch.logsumexp(z64, -1)
        kept = t != -100
        per_row = torch.nn.functional.cross_entropy(z64, t, reduction="none") + z * torch.where(
            kept, want_lse, torch.zeros_like(want_lse)) ** 2
        want = {"mean": per_row.sum() / kept.sum(), "sum": per_row.sum(), "none": per_row}[reduction]
        # Rows with NaN or +inf, or all -inf, give NaN (docs/semantics.md); a -inf element is a 0 there.
        xd = x0.double()
        fine = ~(torch.isnan(xd) | (xd == float("inf"))).any(-1) & (xd > -float("inf")).any(-1)
        what = f"{dtype} {shape} T={T} {reduction}"
        _check(lse[fine], want_lse[fine].detach().cpu().numpy(), dtype, f"{what} lse")
        if reduction == "none":
            _check_loss(loss[fine], want[fine].detach().cpu().numpy(), dtype, f"{what} loss")
            assert torch.isnan(loss[~fine]).all(), what
            assert (~fine).sum() == 3 and fine[1], what
        else:
            _check_loss(loss, want.detach().cpu().numpy(), dtype, f"{what} loss")
        w = torch.randn(loss.shape, device="cuda", dtype=torch.float64)
        gx, = torch.autograd.grad((loss.double() * w).sum(), x)
        wx, = torch.autograd.grad((want * w)[fine].sum() if reduction == "none" else want * w, x64)
        atol, rtol = TOL[dtype]
        err = (gx.double() - wx)[fine].abs()
        assert (err <= 4 * (atol + rtol * (1 + wx[fine].abs()))).all(), (what, err.max().item())
        assert (gx[7] == 0).all(), what
        assert torch.isnan(gx[~fine]).all(), what


def _bits(a):
    """The array's bits as integers of its width (NaN payloads and signed zeros compared too)."""
    return a.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()])


def _consumer_plan(rows, cols, dtype, aligned=True, peelable=True, forced=None, **what):
    """The planner's consumer plan on this GPU (contiguous rows by default, as _on_chip's; aligned
    and peelable as paths.rows_problem takes them)."""
    import gpu_util
    e = torch.empty((), dtype=tdtype(dtype)).element_size()
    prob = paths.rows_problem(rows, cols, e, aligned=aligned, peelable=peelable)
    return gpu_util._planner().plan_consumer(dict(prob, **what), gpu_util.device_plan_args(), forced or {})


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape", paths.CE_OVER_THE_LOGITS, ids=str)
def test_cross_entropy_loss_alone(dtype, shape):
    """Cross-entropy without its gradient takes the statistics' plan (asserted from the planner: on
    chip for rows to 128 KiB, else consumer_rows.cu's kernel): loss and lse against float64, with
    targets at each row's first and last columns and next to them, an ignored row, one outside the
    row (NaN), special values, T = 0.6 and z-loss; each reduction against float64 on logits without
    special values; where the gradient's call takes the same plan, the same bits of loss and lse as
    it (the loss from the same logit, CrossEntropyLossOut)."""
    rows, cols = shape
    alone = _consumer_plan(rows, cols, dtype, cross_entropy=True)
    assert alone == _consumer_plan(rows, cols, dtype), alone
    same_plan = alone == _consumer_plan(rows, cols, dtype, cross_entropy=True, writes_grad=True)
    t = torch.randint(0, cols, (rows,), generator=torch.Generator().manual_seed(44))
    for i in range(8):
        t[9 + i], t[17 + i] = i, cols - 1 - i
    t[7], t[8] = -100, cols
    t = t.cuda()
    for special, T, z in ((True, 1.0, 1e-3), (True, 0.6, 0.0), (False, 0.6, 1e-4)):
        x0 = _logits(shape, dtype, special, 45 + int(special))
        z64 = x0.double().cuda() / T
        want_lse = torch.logsumexp(z64, -1)
        tc = t.clamp(0, cols - 1)
        per_row = torch.nn.functional.cross_entropy(z64, tc, reduction="none") + z * want_lse ** 2
        x0 = x0.cuda()
        what = f"{dtype} {shape} T={T} z={z} special={special} plan={alone['family']}"
        loss, lse = softlight.cross_entropy(x0, t, reduction="none", z_loss=z, temperature=T, return_lse=True)
        fine = torch.isfinite(x0.double()).all(-1) & (t >= 0) & (t < cols)
        _check(lse[fine], want_lse[fine].cpu().numpy(), dtype, f"{what} lse")
        _check(loss[fine], per_row[fine].cpu().numpy(), dtype, f"{what} loss")
        assert loss[7] == 0 and torch.isnan(loss[8]), what
        if same_plan:
            loss2, lse2, _ = softlight.cross_entropy(x0, t, reduction="none", z_loss=z, temperature=T,
                                                     return_lse=True, grad=True)
            assert torch.equal(_bits(loss), _bits(loss2)) and torch.equal(_bits(lse), _bits(lse2)), what
        if special:
            continue
        kept = t.clone()
        kept[8] = 0
        per_row = torch.nn.functional.cross_entropy(z64, kept, reduction="none") + z * torch.where(
            kept != -100, want_lse, torch.zeros_like(want_lse)) ** 2
        for reduction, want in (("sum", per_row.sum()), ("mean", per_row.sum() / (kept != -100).sum())):
            got = softlight.cross_entropy(x0, kept, reduction=reduction, z_loss=z, temperature=T)
            _check_loss(torch.as_tensor(got), want.cpu().numpy(), dtype, f"{what} {reduction}")


def _check_ce_rows(x0, t, T, z, loss, lse, g, dtype, what):
    """cross_entropy(reduction="none") of x0 against float64: the loss, lse and gradient of the rows
    whose logits are finite and whose target lies in the row; row 7 (ignored) 0, row 8 (a target
    outside the row) NaN."""
    cols = x0.shape[1]
    z64 = x0.double() / T
    want_lse = torch.logsumexp(z64, -1)
    tc = t.clamp(0, cols - 1)
    want = torch.nn.functional.cross_entropy(z64, tc, reduction="none") + z * want_lse ** 2
    onehot = torch.nn.functional.one_hot(tc, cols).double()
    want_g = (torch.softmax(z64, -1) * (1 + 2 * z * want_lse)[:, None] - onehot) / T
    fine = torch.isfinite(x0.double()).all(-1) & (t >= 0) & (t < cols)
    _check(lse[fine], want_lse[fine].cpu().numpy(), dtype, f"{what} lse")
    _check(loss[fine], want[fine].cpu().numpy(), dtype, f"{what} loss")
    atol, rtol = TOL[dtype]
    err = (g.double() - want_g)[fine].abs()
    assert (err <= 4 * (atol + rtol * (1 + want_g[fine].abs()))).all(), (what, err.max().item())
    assert loss[7] == 0 and (g[7] == 0).all() and torch.isnan(loss[8]) and torch.isnan(g[8]).all(), what


def _edge_targets(rows, cols, seed):
    t = torch.randint(0, cols, (rows,), generator=torch.Generator().manual_seed(seed))
    for i in range(8):
        t[9 + i], t[17 + i] = i, cols - 1 - i
    t[7], t[8] = -100, cols
    return t.cuda()


@pytest.mark.parametrize("dtype", ["float32"])
@pytest.mark.parametrize("cols", [20000, 32000, 32777], ids=str)
def test_cross_entropy_in_block_rows(dtype, cols):
    """fp32 logits one element into their rows (a column slice) with a fresh gradient: no 16-byte
    packs line up, and block_rows holds each row in shared memory (asserted from the planner) and writes
    the gradient from there, element by element. Loss, lse and gradient against float64 with
    special values, targets at the rows' edges, an ignored row, one outside the row, z-loss, T = 0.6."""
    rows = 40
    p = _consumer_plan(rows, cols, dtype, aligned=False, peelable=False, cross_entropy=True, writes_grad=True)
    on_path((p["family"], p["resident"]) == ("block_rows", True), f"{dtype} {cols} in block_rows")
    t = _edge_targets(rows, cols, 50)
    for special, T, z in ((True, 1.0, 1e-3), (False, 0.6, 0.0)):
        big = _logits((rows, cols + 1), dtype, special, 51 + int(special)).cuda()
        x = big[:, 1:]
        what = f"{dtype} {cols} T={T} special={special}"
        loss, lse, g = softlight.cross_entropy(x, t, reduction="none", z_loss=z, temperature=T, return_lse=True,
                                               grad=True)
        _check_ce_rows(x, t, T, z, loss, lse, g, dtype, what)


@pytest.mark.parametrize("dtype", ["float32"])
@pytest.mark.parametrize("cols", [20001, 50257], ids=str)
def test_cross_entropy_in_block_rows_peeled(dtype, cols, force):
    """The gradient over logits whose rows are off 16 bytes alike (grad=x), the clusters' peeling
    forced off (peel_clusters 0): block_rows peels each row and holds it in shared memory (asserted
    from the planner), its packs written whole between the edges. Against float64 as above."""
    rows = 40
    force(peel_clusters=0)
    p = _consumer_plan(rows, cols, dtype, aligned=False, forced=dict(peel_clusters=0), cross_entropy=True,
                       writes_grad=True)
    on_path((p["family"], p["resident"], p["peel"]) == ("block_rows", True, True), f"{dtype} {cols} peeled")
    t = _edge_targets(rows, cols, 52)
    for special, T, z in ((True, 1.0, 1e-3), (False, 0.6, 0.0)):
        big = _logits((rows, cols + 3), dtype, special, 53 + int(special)).cuda()
        x0 = big[:, 3:].clone()
        x = big[:, 3:]
        what = f"{dtype} {cols} T={T} special={special}"
        loss, lse, g = softlight.cross_entropy(x, t, reduction="none", z_loss=z, temperature=T, return_lse=True,
                                               grad=x)
        assert g.data_ptr() == x.data_ptr(), what
        _check_ce_rows(x0, t, T, z, loss, lse, g, dtype, what)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cross_entropy_reduces_many_rows(dtype):
    """The mean's count of kept rows over a grid (integer atomics) and the losses' sum in pieces of
    rows, then over the pieces (past 65536 rows): 65536, 65537 and 3000017 rows of 10 classes, about
    a tenth of the targets ignored, the loss alone and with its gradient, against float64; the same
    bits at every call; the gradient of the mean that of the sum over the kept rows' count."""
    for rows in (65536, 65537, 3000017):
        g = torch.Generator(device="cuda").manual_seed(rows)
        x = (torch.randn(rows, 10, device="cuda", generator=g) * 3).to(tdtype(dtype))
        t = torch.randint(0, 10, (rows,), device="cuda", generator=g)
        t[torch.rand(rows, device="cuda", generator=g) < 0.1] = -100
        x64 = x.double()
        per_row = torch.nn.functional.cross_entropy(x64, t, reduction="none")
        kept = int((t != -100).sum())
        ignored = t == -100
        onehot = torch.nn.functional.one_hot(t.clamp(0, 9), 10).double()
        want_g = torch.where(ignored[:, None], 0.0, torch.softmax(x64, -1) - onehot)
        for reduction, want, k in (("sum", per_row.sum(), 1.0), ("mean", per_row.sum() / kept, kept)):
            what = f"{dtype} {rows} {reduction}"
            a = softlight.cross_entropy(x, t, reduction=reduction)
            b = softlight.cross_entropy(x, t, reduction=reduction)
            loss, grad = softlight.cross_entropy(x, t, reduction=reduction, grad=True)
            assert torch.equal(_bits(torch.as_tensor(a)), _bits(torch.as_tensor(b))), what
            assert torch.equal(_bits(torch.as_tensor(a)), _bits(torch.as_tensor(loss))), what
            _check_loss(torch.as_tensor(a), want.cpu().numpy(), dtype, what)
            assert (grad[ignored] == 0).all(), what
            atol, rtol = TOL[dtype]
            err = (grad.double() * k - want_g).abs()
            assert (err <= 4 * (atol + rtol * (1 + want_g.abs()))).all(), (what, err.max().item())


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape", paths.CE_OVER_THE_LOGITS, ids=str)
def test_cross_entropy_over_the_logits(dtype, shape):
    """The gradient written over the logits (grad=x) takes the plan a fresh gradient takes (on chip
    where _on_chip says so; float64 consumer_rows.cu's kernel): the same bits of loss, lse and
    gradient as a fresh gradient, with targets at each row's first and last columns and next to them
    (a peeled row's edges), an ignored row, one outside the row (NaN), special values, each
    reduction, z-loss and T = 0.6; the loss against float64."""
    rows, cols = shape
    x0 = _logits(shape, dtype, True, 41).cuda()
    t = torch.randint(0, cols, (rows,), generator=torch.Generator().manual_seed(42))
    for i in range(8):
        t[9 + i], t[17 + i] = i, cols - 1 - i
    t[7], t[8] = -100, cols
    t = t.cuda()
    for T, reduction, z in ((1.0, "none", 1e-3), (0.6, "mean", 0.0), (1.0, "sum", 1e-4)):
        what = f"{dtype} {shape} T={T} {reduction}"
        loss, lse, g = softlight.cross_entropy(x0, t, reduction=reduction, z_loss=z, temperature=T,
                                               return_lse=True, grad=True)
        x = x0.clone()
        loss2, lse2, g2 = softlight.cross_entropy(x, t, reduction=reduction, z_loss=z, temperature=T,
                                                  return_lse=True, grad=x)
        assert g2 is x, what
        for a, b, name in ((loss, loss2, "loss"), (lse, lse2, "lse"), (g, g2, "gradient")):
            assert torch.equal(_bits(a), _bits(b)), (what, name)
        if reduction == "none":
            z64 = x0.double() / T
            want_lse = torch.logsumexp(z64, -1)
            want = torch.nn.functional.cross_entropy(z64, t.clamp(0, cols - 1), reduction="none") + z * want_lse ** 2
            fine = torch.isfinite(x0.double()).all(-1) & (t >= 0) & (t < cols)
            _check(loss2[fine], want[fine].cpu().numpy(), dtype, f"{what} loss")
            assert loss2[7] == 0 and torch.isnan(loss2[8]), what
            assert (g2[7] == 0).all() and torch.isnan(g2[8]).all(), what


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_on_the_gpu_equals_torch(dtype, reduction):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(257, 32000, generator=g) * 3).to(tdtype(dtype)).cuda().requires_grad_()
    t = torch.randint(0, 32000, (257,), generator=g).cuda()
    t[5] = -100
    loss = slt.cross_entropy(x, t, reduction=reduction, label_smoothing=0.1)
    x64 = x.detach().double().requires_grad_()
    want = torch.nn.functional.cross_entropy(x64, t, reduction=reduction, label_smoothing=0.1)
    assert loss.dtype == x.dtype  # as torch returns it
    rtol = 1e-5 if dtype == "float32" else torch.finfo(x.dtype).eps  # (one rounding to bfloat16)
    assert torch.allclose(loss.double(), want.to(x.dtype).double(), rtol=rtol, atol=1e-5)
    w = torch.randn(loss.shape, device="cuda", dtype=torch.float64)
    gx, = torch.autograd.grad((loss.double() * w).sum(), x)
    wx, = torch.autograd.grad((want * w).sum(), x64)
    tol = 1e-6 if dtype == "float32" else 4e-3
    assert ((gx.double() - wx).abs() <= tol * (1 + wx.abs().max())).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_backward_scales_in_place_on_the_gpu(dtype):
    """The backward of softlight.torch.cross_entropy on CUDA: the forward's gradient scaled in place by the
    upstream gradient read on the device (65536, 1, one a row), equal to the CPU's bit for bit where the
    upstream gradient is 1 and to rounding elsewhere; a second backward gives the same bits."""
    x = _logits((33, 5000), dtype, False, 7)
    t = torch.randint(0, 5000, (33,), generator=torch.Generator().manual_seed(8))
    t[4] = -100
    ups = {"mean": torch.tensor(65536.0), "sum": torch.tensor(1.0), "none": torch.rand(33, dtype=torch.float64)}
    ups["none"][::3] = 1.0
    for reduction, d in ups.items():
        grads = []
        for dev in ("cpu", "cuda"):
            xd = x.to(dev).requires_grad_()
            loss = slt.cross_entropy(xd, t.to(dev), reduction=reduction)
            first, = torch.autograd.grad(loss, xd, d.to(dev, loss.dtype), retain_graph=True)
            second, = torch.autograd.grad(loss, xd, d.to(dev, loss.dtype))
            assert torch.equal(first, second), (dev, reduction)
            grads.append(first.cpu().double())
        tol = TOL[dtype]
        assert torch.allclose(grads[1], grads[0], rtol=tol[1], atol=tol[0] * float(d.abs().max())), reduction


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(2048, 32000), (64, 151936), (16, 262144)], ids=str)
def test_cross_entropy_allocates_the_gradient_and_rows_only(dtype, shape):
    """Forward and backward of softlight.torch.cross_entropy allocate, beside the logits, the gradient
    and a few floats a row (torch.cuda.max_memory_allocated): no other buffer of the logits' size.
    (cluster_rows' workspace, a few bytes a row, comes from a CUDA memory pool of its own.)"""
    rows, vocab = shape
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(shape, device="cuda", generator=g).to(tdtype(dtype)).requires_grad_()
    t = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    base = torch.cuda.memory_allocated()
    gradient = torch.empty_like(x)  # what one tensor of the logits' size costs the allocator (its rounding)
    one = torch.cuda.memory_allocated() - base
    del gradient
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    slt.cross_entropy(x, t).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert x.grad is not None and x.grad.shape == x.shape
    assert one >= x.numel() * x.element_size() and one <= extra <= one + 64 * rows + 64 * 1024, (extra, one)


def test_compile_on_the_gpu_without_graph_breaks():
    def step(logits, target, idx):
        return slt.cross_entropy(logits, target) + slt.entropy(logits).mean() - slt.token_logprobs(logits, idx).mean()

    x = torch.randn(64, 1000, device="cuda", requires_grad=True)
    t = torch.randint(0, 1000, (64,), device="cuda")
    i = torch.randint(0, 1000, (64, 2), device="cuda")
    explained = torch._dynamo.explain(step)(x, t, i)
    assert explained.graph_break_count == 0
    compiled = torch.compile(step, fullgraph=True)
    got, want = compiled(x, t, i), step(x, t, i)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    gx, = torch.autograd.grad(got, x)
    wx, = torch.autograd.grad(want, x)
    assert torch.allclose(gx, wx, rtol=1e-5, atol=1e-7)


def test_a_token_outside_the_row_gives_nan_on_the_gpu():
    x = torch.randn(4, 10, device="cuda")
    idx = torch.tensor([0, 10, 3, -1], device="cuda")
    lp = slt.token_logprobs(x, idx)
    assert torch.isnan(lp[1]) and torch.isnan(lp[3]) and torch.isfinite(lp[0]) and torch.isfinite(lp[2])
    torch.cuda.synchronize()  # the context is intact
    assert torch.isfinite(slt.entropy(x)).all()


def test_cupy_arrays_and_their_stream():
    cupy = pytest.importorskip("cupy")
    x = cupy.asarray(np.random.default_rng(0).standard_normal((33, 5000)).astype(np.float32))
    idx = cupy.asarray(np.random.default_rng(1).integers(0, 5000, (33, 2)))
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        st = softlight.row_stats(x, idx, stats=("lse", "entropy", "logprobs"))
    s.synchronize()
    ref = stats_ref(cupy.asnumpy(x).astype(np.float64), cupy.asnumpy(idx))
    for name in ("lse", "logprobs"):
        _check(torch.as_tensor(cupy.asnumpy(st[name])), ref[name], "float32", name)


def test_cross_entropy_sums_against_a_reference_on_the_gpu():
    """The smoothing term's sum from the row's first element (consumer_rows.cu, sum_ref): logits with
    a common offset keep their precision, float64 logits near 1e308 give a finite loss and gradient,
    and broadcast logits (row stride 0) are computed."""
    g = torch.Generator().manual_seed(11)
    for offset in (1e4, 1e6):
        x = (torch.randn(64, 5000, generator=g, dtype=torch.float64) + offset).float()
        t = torch.randint(0, 5000, (64,), generator=g)
        want = torch.nn.functional.cross_entropy(x.double(), t, label_smoothing=0.1).item()
        got = slt.cross_entropy(x.cuda(), t.cuda(), label_smoothing=0.1).item()
        assert abs(got - want) <= 1e-7 * abs(want), (offset, got, want)
        s = softlight.row_stats(x.cuda(), stats=("sum",))["sum"].double().cpu()
        assert torch.allclose(s, x.double().sum(-1), rtol=1e-7), offset
    x = (torch.rand(4, 10, generator=g, dtype=torch.float64) * 0.2e308 + 1.5e308).cuda().requires_grad_()
    t = torch.tensor([1, 2, 3, 4], device="cuda")
    for eps in (0.0, 1.0):
        loss = slt.cross_entropy(x, t, label_smoothing=eps)
        gx, = torch.autograd.grad(loss, x)
        assert torch.isfinite(loss) and torch.isfinite(gx).all(), eps
        cpu = softlight.cross_entropy(x.detach().cpu().numpy(), t.cpu().numpy(), label_smoothing=eps)
        assert abs(loss.item() - float(cpu)) <= 1e-12 * abs(float(cpu)), eps
    row = torch.randn(1, 300, generator=g).cuda()
    b = row.expand(6, 300)
    tt = torch.full((6,), 7, device="cuda")
    assert torch.allclose(slt.cross_entropy(b, tt, reduction="none"),
                          torch.nn.functional.cross_entropy(b.contiguous(), tt, reduction="none"), rtol=1e-6)

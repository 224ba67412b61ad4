"""softlight.torch's consumers of the log-sum-exp (CPU): against torch in float64, gradcheck, opcheck,
torch.compile without graph breaks, autocast, layouts."""
import math

import pytest

torch = pytest.importorskip("torch")
import softlight  # noqa: E402
import softlight.torch as slt  # noqa: E402
from softlight._consumers import STATS  # noqa: E402


def _ref_ce(x, t, reduction="mean", eps=0.0, zl=0.0, temperature=1.0):
    z = x / temperature
    loss = torch.nn.functional.cross_entropy(z, t, reduction="none", label_smoothing=eps)
    keep = t != -100
    loss = torch.where(keep, loss + zl * torch.logsumexp(z, -1) ** 2, torch.zeros_like(loss))
    return {"none": loss, "sum": loss.sum(), "mean": loss.sum() / keep.sum()}[reduction]


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("eps,zl,temperature", [(0.0, 0.0, 1.0), (0.1, 1e-3, 0.7)])
def test_cross_entropy_equals_torch_float64(reduction, eps, zl, temperature):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(29, 301, generator=g, dtype=torch.float64) * 3).requires_grad_()
    t = torch.randint(0, 301, (29,), generator=g)
    t[3] = -100
    got = slt.cross_entropy(x, t, reduction=reduction, label_smoothing=eps, z_loss=zl, temperature=temperature)
    want = _ref_ce(x, t, reduction, eps, zl, temperature)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    w = torch.randn(got.shape, generator=g, dtype=torch.float64)
    gx, = torch.autograd.grad((got * w).sum(), x)
    wx, = torch.autograd.grad((want * w).sum(), x)
    assert torch.allclose(gx, wx, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cross_entropy_low_precision_against_float64(dtype):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(64, 5000, generator=g) * 3).to(dtype).requires_grad_()
    t = torch.randint(0, 5000, (64,), generator=g)
    loss = slt.cross_entropy(x, t)
    assert loss.dtype == dtype == torch.nn.functional.cross_entropy(x, t).dtype  # as torch returns it
    loss = loss.float()
    x64 = x.detach().double().requires_grad_()
    want = torch.nn.functional.cross_entropy(x64, t)
    # (the loss rounded once to its dtype, as torch's)
    assert abs(loss.item() - want.item()) < 1e-5 * (1 + abs(want.item())) + torch.finfo(dtype).eps * abs(want.item())
    gx, = torch.autograd.grad(loss, x)
    wx, = torch.autograd.grad(want, x64)
    assert gx.dtype == dtype
    tol = {torch.float32: 1e-7, torch.bfloat16: 2e-6, torch.float16: 2e-7}[dtype]  # |g| < 1 / 64 here
    assert (gx.double() - wx).abs().max() < tol + 8e-3 * wx.abs().max()


def test_cross_entropy_torch_shapes():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 11, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 11, (2, 3, 4), generator=g)
    for red in ("none", "mean"):
        got = slt.cross_entropy(x, t, reduction=red)
        want = torch.nn.functional.cross_entropy(x, t, reduction=red)
        assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    one = torch.randn(7, dtype=torch.float64)
    assert torch.allclose(slt.cross_entropy(one, torch.tensor(3)),
                          torch.nn.functional.cross_entropy(one, torch.tensor(3)))
    loss_fn = slt.CrossEntropyLoss(label_smoothing=0.2)
    y = torch.randn(5, 9, dtype=torch.float64)
    tt = torch.randint(0, 9, (5,))
    assert torch.allclose(loss_fn(y, tt), torch.nn.CrossEntropyLoss(label_smoothing=0.2)(y, tt))


def test_token_logprobs_entropy_logsumexp_equal_torch():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 5, 200, generator=g, dtype=torch.float64, requires_grad=True)
    idx = torch.randint(0, 200, (3, 5, 4), generator=g)
    checks = [
        (slt.token_logprobs(x, idx, temperature=1.3), torch.log_softmax(x / 1.3, -1).gather(-1, idx)),
        (slt.token_logprobs(x, idx[..., 0]), torch.log_softmax(x, -1).gather(-1, idx[..., :1])[..., 0]),
        (slt.entropy(x, temperature=0.5),
         -(torch.softmax(x / 0.5, -1) * torch.log_softmax(x / 0.5, -1)).sum(-1)),
        (slt.entropy(x, dim=1), -(torch.softmax(x, 1) * torch.log_softmax(x, 1)).sum(1)),
        (slt.logsumexp(x, 0), torch.logsumexp(x, 0)),
    ]
    for got, want in checks:
        assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-12, atol=1e-12)
        w = torch.randn(got.shape, generator=g, dtype=torch.float64)
        gx, = torch.autograd.grad((got * w).sum(), x)
        wx, = torch.autograd.grad((want * w).sum(), x)
        assert torch.allclose(gx, wx, rtol=1e-10, atol=1e-12)


def test_only_the_statistics_asked_are_computed():
    """row_stats(stats=...) computes lse and what is named: the rest come back empty from the operator
    and are left out of the dict; what is computed equals the full call's, bit for bit on the CPU."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(7, 300, generator=g)
    idx = torch.randint(0, 300, (7, 2), generator=g)
    full = slt.row_stats(x, idx, temperature=0.7)
    for names in (("logprobs",), ("entropy",), ("max", "sumexp"), ()):
        part = slt.row_stats(x, idx, temperature=0.7, stats=names)
        assert set(part) == {"lse", *names}
        for n, v in part.items():
            assert torch.equal(v, full[n]), n
    raw = torch.ops.softlight.row_stats(x, idx, 0.7, 0, False, 0b101)
    assert [tuple(t.shape) for t in raw] == [(7,), (0,), (7, 2)] + [(0,)] * 5
    with pytest.raises(softlight.InvalidArgumentError, match="unknown statistic"):
        slt.row_stats(x, stats=("mean",))


def test_gradcheck_and_opcheck():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 30, generator=g, dtype=torch.float64, requires_grad=True)
    idx = torch.randint(0, 30, (6, 3), generator=g)
    t = torch.randint(0, 30, (6,), generator=g)
    t[2] = -100
    fns = [lambda a: slt.token_logprobs(a, idx, temperature=0.9), lambda a: slt.entropy(a, temperature=1.7),
           lambda a: slt.logsumexp(a), lambda a: slt.cross_entropy(a, t, label_smoothing=0.3, z_loss=0.01),
           lambda a: slt.cross_entropy(a, t, reduction="none", temperature=0.8),
           lambda a: slt.cross_entropy(a, t, return_lse=True)[1]]
    for f in fns:
        assert torch.autograd.gradcheck(f, (x,))
    xd = x.detach()
    torch.library.opcheck(torch.ops.softlight.row_stats.default, (xd, idx, 0.9))
    torch.library.opcheck(torch.ops.softlight.row_stats.default, (xd, None))
    torch.library.opcheck(torch.ops.softlight.row_stats.default, (xd, t.clamp(min=0) + 30, 1.0, 30, True))
    for mask in (0b101, 0b11, 0b1100000):  # lse + logprobs, lse + entropy, max + sumexp (and lse)
        torch.library.opcheck(torch.ops.softlight.row_stats.default, (xd, idx, 0.9, 0, False, mask))
    torch.library.opcheck(torch.ops.softlight.cross_entropy.default, (xd, t, -100, 0.1, 0.0, 1.0, 2, True))
    torch.library.opcheck(torch.ops.softlight.cross_entropy.default, (xd, t, -100, 0.0, 0.0, 1.0, 0, False))
    torch.library.opcheck(torch.ops.softlight.cross_entropy_backward.default,
                          (xd, t, torch.tensor(0.7, dtype=torch.float64), -100, 0.1, 0.01, 1.0, 2))
    torch.library.opcheck(torch.ops.softlight.cross_entropy_backward.default,
                          (xd, t, torch.randn(6, dtype=torch.float64), -100, 0.0, 0.0, 0.8, 0))
    lse = torch.logsumexp(xd, -1)
    ent = -(torch.softmax(xd, -1) * torch.log_softmax(xd, -1)).sum(-1)
    d = torch.randn(6, dtype=torch.float64)
    torch.library.opcheck(torch.ops.softlight.row_stats_backward.default,
                          (xd, lse, ent, idx, d, d, torch.randn(6, 3, dtype=torch.float64), None, d))
    # Double backward: a clear error.
    y = slt.entropy(x).sum()
    gx, = torch.autograd.grad(y, x, create_graph=True)
    with pytest.raises(softlight.InvalidArgumentError, match="double backward"):
        gx.sum().backward()


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_without_graph_breaks(dynamic):
    g = torch.Generator().manual_seed(6)

    def step(logits, target, idx):
        return (slt.cross_entropy(logits, target, z_loss=1e-4) + slt.entropy(logits).mean()
                - slt.token_logprobs(logits, idx).mean() + slt.logsumexp(logits).mean())

    explained = torch._dynamo.explain(step)(torch.randn(8, 100), torch.randint(0, 100, (8,)),
                                            torch.randint(0, 100, (8, 2)))
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for rows in (8, 13):
        x = torch.randn(rows, 100, generator=g, requires_grad=True)
        t = torch.randint(0, 100, (rows,), generator=g)
        i = torch.randint(0, 100, (rows, 2), generator=g)
        got = compiled(x, t, i)
        want = step(x, t, i)
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
        gx, = torch.autograd.grad(got, x)
        wx, = torch.autograd.grad(want, x)
        assert torch.allclose(gx, wx, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compiled_cross_entropy_writes_the_gradient_in_the_backward(reduction):
    """Under torch.compile the forward reads the logits for the loss alone and the backward writes the
    gradient for the upstream gradient it is given (cross_entropy_backward: a traced graph cannot know
    that it is 1, and would scale a forward's gradient with a pass of its own); the gradient equals
    eager's, which is written in the forward."""
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

    graphs = []

    def backend(gm, example_inputs):
        def keep(g, _):
            graphs.append([line for line in str(g.graph).splitlines() if "softlight" in line or "aten.mul" in line])
            return make_boxed_func(g.forward)
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    g = torch.Generator().manual_seed(8)
    w = torch.randn(16, 300, generator=g, requires_grad=True)
    h = torch.randn(12, 16, generator=g)
    t = torch.randint(0, 300, (12,), generator=g)
    t[3] = -100
    up = torch.rand(12 if reduction == "none" else (), generator=g) + 0.5

    def f(h, t):
        return slt.cross_entropy(h @ w, t, z_loss=1e-3, reduction=reduction)

    torch._dynamo.reset()
    got, = torch.autograd.grad(torch.compile(f, fullgraph=True, backend=backend)(h, t), w, up)
    want, = torch.autograd.grad(f(h, t), w, up)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    forward, backward = graphs
    assert len(forward) == 1 and "softlight.cross_entropy.default" in forward[0], forward
    assert "True" not in forward[0], forward  # with_grad left False: no gradient written there
    assert len(backward) == 1 and "softlight.cross_entropy_backward.default" in backward[0], backward


def test_autocast_gives_float32():
    x = torch.randn(4, 50)
    t = torch.randint(0, 50, (4,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert slt.cross_entropy(x.bfloat16(), t).dtype == torch.float32
        assert slt.entropy(x.bfloat16()).dtype == torch.float32


def test_layouts_and_refusals():
    x = torch.randn(50, 8, dtype=torch.float64)
    v = x.t()  # the vocabulary axis strided: made contiguous
    t = torch.randint(0, 50, (8,))
    assert torch.allclose(slt.cross_entropy(v, t), torch.nn.functional.cross_entropy(v, t))
    assert torch.allclose(slt.entropy(x[::2]), -(torch.softmax(x[::2], -1) * torch.log_softmax(x[::2], -1)).sum(-1))
    with pytest.raises(softlight.InvalidArgumentError, match="outside the vocabulary"):
        slt.cross_entropy(v, torch.full((8,), 50))
    with pytest.raises(softlight.InvalidArgumentError, match="probabilities"):
        slt.cross_entropy(v, torch.rand(8, 50, dtype=torch.float64))
    with pytest.raises(softlight.UnsupportedDTypeError):
        slt.entropy(torch.zeros(3, 4, dtype=torch.int32))
    if torch.cuda.is_available():  # the GPU's entry: a uniform row's entropy is log(cols)
        got = slt.entropy(torch.zeros(3, 4, device="cuda"))
        assert got.device.type == "cuda" and torch.allclose(got.cpu(), torch.full((3,), math.log(4.0)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_backward_scales_the_forward_gradient_and_repeats_it_exactly(dtype):
    """The backward hands out the forward's gradient scaled in place by the upstream gradient (65536 as a
    loss scaler gives it, 1, one a row); a second backward through the graph gives the same bits."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(7, 300, generator=g) * 2).to(dtype).requires_grad_()
    t = torch.randint(0, 300, (7,), generator=g)
    t[1] = -100
    ups = {"mean": torch.tensor(65536.0), "sum": torch.tensor(1.0), "none": torch.tensor([1, 2, 0.5, 1, 1, -3, 1.0])}
    rtol, atol = {torch.float64: (1e-12, 1e-15), torch.float32: (1e-5, 1e-8), torch.bfloat16: (1e-2, 1e-5)}[dtype]
    for reduction, d in ups.items():
        loss = slt.cross_entropy(x, t, reduction=reduction)
        first, = torch.autograd.grad(loss, x, d.to(loss.dtype), retain_graph=True)
        second, = torch.autograd.grad(loss, x, d.to(loss.dtype))
        assert torch.equal(first, second), reduction
        x64 = x.detach().double().requires_grad_()
        want, = torch.autograd.grad(torch.nn.functional.cross_entropy(x64, t, reduction=reduction), x64, d.double())
        assert torch.allclose(first.double(), want, rtol=rtol, atol=atol * float(d.abs().max())), reduction
    gbuf = torch.randn(6, 30, dtype=torch.float64)
    torch.library.opcheck(torch.ops.softlight.cross_entropy_grad_scale_.default, (gbuf, torch.tensor(2.0).double()))
    torch.library.opcheck(torch.ops.softlight.cross_entropy_grad_scale_.default, (gbuf, torch.rand(6).double()))


def test_one_pass_gradient_accumulates():
    """The forward's gradient handed back as it is for loss.backward() must still accumulate."""
    x = torch.randn(4, 10, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 10, (4,))
    want, = torch.autograd.grad(torch.nn.functional.cross_entropy(x, t), x)
    loss = slt.cross_entropy(x, t)
    loss.backward(retain_graph=True)
    loss.backward()
    assert torch.allclose(x.grad, 2 * want, rtol=1e-12, atol=1e-15)
    x.grad = None
    (slt.cross_entropy(x, t) * 3).backward()
    assert torch.allclose(x.grad, 3 * want, rtol=1e-12, atol=1e-15)


def _made_by(t):
    """The autograd node that made t, past views."""
    f = t.grad_fn
    while f.name() == "ViewBackward0":
        f = f.next_functions[0][0]
    return f.name()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_eager_cross_entropy_equals_the_operator(dtype):
    """Plain eager autograd takes cross_entropy's body without the operator's dispatch (an
    autograd.Function); the operator, which autocast, torch.compile, dispatch modes and transforms take,
    gives the same bits of loss, lse and gradient, with and without the forward's gradient."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(9, 301, generator=g) * 3).to(dtype)
    t = torch.randint(0, 301, (9,), generator=g)
    t[2] = -100
    for reduction, eps, zl in (("mean", 0.0, 0.0), ("none", 0.1, 1e-3), ("sum", 0.0, 1e-4)):
        red = {"none": 0, "sum": 1, "mean": 2}[reduction]
        up = torch.rand(9 if reduction == "none" else (), generator=g)
        a = x.clone().requires_grad_()
        loss, lse = slt.cross_entropy(a, t, reduction=reduction, label_smoothing=eps, z_loss=zl, return_lse=True)
        assert loss.dtype == x.dtype  # as torch returns it, cast from the float32 loss
        fn = loss.grad_fn
        while fn.name() in ("ViewBackward0", "ToCopyBackward0"):  # (through the reshape and the cast)
            fn = fn.next_functions[0][0]
        assert fn.name() == "_CrossEntropyEagerBackward"
        (loss * up.to(loss.dtype)).sum().backward()
        b = x.clone().requires_grad_()
        want, want_lse, _ = torch.ops.softlight.cross_entropy(b, t, -100, eps, zl, 1.0, red, True)
        assert "_CrossEntropyEager" not in _made_by(want)
        (want.to(dtype) * up.to(dtype)).sum().backward()
        assert torch.equal(loss, want.to(dtype)) and torch.equal(lse, want_lse), reduction
        assert torch.equal(a.grad, b.grad), reduction
        with torch.no_grad():
            assert torch.equal(slt.cross_entropy(a, t, reduction=reduction, label_smoothing=eps, z_loss=zl),
                               want.to(dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the operator: float32 under autocast
        loss = slt.cross_entropy(x.float().requires_grad_(), t)
    assert loss.dtype == torch.float32 and "_CrossEntropyEager" not in _made_by(loss)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_eager_row_stats_equals_the_operator(dtype):
    """Plain eager autograd takes row_stats's body and backward without the operator's dispatch (an
    autograd.Function); the operator gives the same bits of every statistic and of the gradient, with
    tokens or without; a backward that builds a graph is still refused."""
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(7, 203, generator=g) * 3).to(dtype)
    idx = torch.randint(0, 203, (7, 2), generator=g)
    names = ("lse", "entropy", "logprobs", "picked", "sum")
    for index, stats, T in ((idx, names, 0.8), (None, ("lse", "entropy"), 1.0), (idx[:, 0], ("logprobs",), 1.0)):
        a = x.clone().requires_grad_()
        got = slt.row_stats(a, index, temperature=T, stats=stats)
        assert _made_by(got["lse"]) == "_RowStatsEagerBackward"
        b = x.clone().requires_grad_()
        mask = sum(1 << STATS.index(n) for n in set(stats) | {"lse"})
        flat = None if index is None else (index.reshape(-1) if index.dim() == 1 else index)
        out = dict(zip(STATS, torch.ops.softlight.row_stats(b, flat, T, 0, False, mask)))
        assert "_RowStatsEager" not in _made_by(out["lse"])
        loss_a = loss_b = 0
        for n in got:
            w = torch.rand(got[n].shape, generator=g)
            assert torch.equal(got[n], out[n].reshape(got[n].shape)), n
            if n in ("lse", "entropy", "logprobs", "picked", "sum"):
                loss_a = loss_a + (got[n] * w).sum()
                loss_b = loss_b + (out[n].reshape(got[n].shape) * w).sum()
        loss_a.backward()
        loss_b.backward()
        assert torch.equal(a.grad, b.grad), stats
    a = x.clone().requires_grad_()
    gx, = torch.autograd.grad(slt.entropy(a).sum(), a, create_graph=True)
    with pytest.raises(softlight.InvalidArgumentError):
        gx.sum().backward()

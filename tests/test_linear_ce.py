"""softlight.torch.linear_cross_entropy on the CPU: the loss and the gradients to hidden, weight and
bias against float64 from the same inputs (and, in 16 bits, no worse than torch eager's own matmul and
cross-entropy), every option, both memory modes, shift without a copy, and bad arguments refused."""
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import softlight.torch as slt  # noqa: E402
from softlight import InvalidArgumentError  # noqa: E402


def reference(h, w, t, b=None, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None, temperature=1.0,
              reduction="mean", shift=False):
    """The loss as torch computes it, in the inputs' dtype (logits in h's dtype, the loss in float)."""
    if shift:
        h, t = h[..., :-1, :], t[..., 1:]
    z = h @ w.t()
    if b is not None:
        z = z + b
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    z = z.float() if z.dtype != torch.float64 else z
    z = z / temperature
    flat, ft = z.reshape(-1, z.shape[-1]), t.reshape(-1)
    loss = F.cross_entropy(flat, ft, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction="none")
    if z_loss:
        loss = loss + z_loss * torch.logsumexp(flat, -1) ** 2 * (ft != ignore_index)
    if reduction == "none":
        return loss.reshape(t.shape)
    return loss.sum() if reduction == "sum" else loss.sum() / (ft != ignore_index).sum()


def grads(fn, *inputs):
    inputs = [x.detach().clone().requires_grad_(True) if x is not None else None for x in inputs]
    loss = fn(*inputs)
    loss.float().sum().backward() if loss.dim() else loss.backward()
    return [loss.detach()] + [None if x is None else x.grad for x in inputs]


def data(n=48, d=32, v=300, dtype=torch.float64, bias=False, seed=0, lead=None):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*(lead or (n,)), d, generator=g, dtype=torch.float64).to(dtype)
    w = (torch.randn(v, d, generator=g, dtype=torch.float64) / d ** 0.5).to(dtype)
    t = torch.randint(0, v, tuple(lead or (n,)), generator=g)
    b = torch.randn(v, generator=g, dtype=torch.float64).to(dtype) if bias else None
    return h, w, t, b


@pytest.fixture
def narrow_vocab_chunks(monkeypatch):
    """low_memory's vocabulary chunks made 37 columns wide (for 48 float64 tokens), so that the tests'
    300-word vocabularies take nine chunks, the last a partial one."""
    from softlight import _linear
    monkeypatch.setattr(_linear, "_LOW_MEMORY_MIN_COLUMNS", 1)
    monkeypatch.setattr(_linear, "_LOW_MEMORY_CHUNK_BYTES", 48 * 8 * 37)


OPTIONS = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(label_smoothing=0.1), dict(z_loss=1e-3),
           dict(temperature=0.7), dict(softcap=3.0), dict(ignore_index=5), dict(shift=True)]


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_float64_equals_the_reference(opts, memory, narrow_vocab_chunks):
    lead = (3, 16) if opts.get("shift") else None
    h, w, t, b = data(bias=True, lead=lead)
    if "ignore_index" in opts:
        t[::3] = opts["ignore_index"]
    ours = grads(lambda h, w, b: slt.linear_cross_entropy(h, w, t, bias=b, memory=memory, **opts), h, w, b)
    ref = grads(lambda h, w, b: reference(h, w, t, b, **opts), h, w, b)
    for name, a, r in zip(("loss", "hidden", "weight", "bias"), ours, ref):
        assert a.shape == r.shape, name
        assert torch.isfinite(a).all(), name
        assert torch.allclose(a, r, rtol=1e-10, atol=1e-12), (name, (a - r).abs().max())


def test_chunks_of_every_size_give_the_same_result(monkeypatch):
    from softlight import _linear
    h, w, t, _ = data(n=37)
    want = grads(lambda h, w: slt.linear_cross_entropy(h, w, t), h, w)
    for chunks in (1, 2, 5, 37, 100):
        monkeypatch.setattr(_linear, "_SPEED_CHUNKS", chunks)
        got = grads(lambda h, w: slt.linear_cross_entropy(h, w, t), h, w)
        for a, r in zip(got, want):
            assert torch.allclose(a, r, rtol=1e-12, atol=1e-14)
    monkeypatch.setattr(_linear, "_LOW_MEMORY_MIN_COLUMNS", 1)
    for columns in (1, 7, 128, 299, 300, 1000):  # chunks of that many words, the last one partial
        monkeypatch.setattr(_linear, "_LOW_MEMORY_CHUNK_BYTES", 37 * 8 * columns)
        assert _linear._chunk_columns(37, 300, 8) == min(300, columns)
        got = grads(lambda h, w: slt.linear_cross_entropy(h, w, t, memory="low_memory"), h, w)
        for a, r in zip(got, want):
            assert torch.allclose(a, r, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_sixteen_bits_no_worse_than_torch_eager(dtype, memory, monkeypatch):
    """From the same 16-bit (or fp32) inputs, the error of each result (loss, and the gradients to hidden,
    weight and bias) against float64, summed over twelve draws, at most 1.1 x torch eager's (matmul in
    the dtype, cross-entropy in float32). One draw's error is a few roundings of either side's matmul,
    whose order differs: the sum over draws compares the two methods, not two roundings. low_memory
    in chunks of 128 words (eight for the 1000 words)."""
    from softlight import _linear
    monkeypatch.setattr(_linear, "_LOW_MEMORY_CHUNK_BYTES", 256 * dtype.itemsize * 128)
    ours_err, eager_err = [0.0] * 4, [0.0] * 4
    for seed in range(3, 15):
        h, w, t, b = data(n=256, d=64, v=1000, dtype=dtype, bias=True, seed=seed)
        exact = grads(lambda h, w, b: reference(h, w, t, b), h.double(), w.double(), b.double())
        ours = grads(lambda h, w, b: slt.linear_cross_entropy(h, w, t, bias=b, memory=memory), h, w, b)
        eager = grads(lambda h, w, b: reference(h, w, t, b), h, w, b)
        for i, (a, e, x) in enumerate(zip(ours, eager, exact)):
            ours_err[i] += (a.double() - x).abs().max().item()
            eager_err[i] += (e.double() - x).abs().max().item()
    for name, a, e in zip(("loss", "hidden", "weight", "bias"), ours_err, eager_err):
        assert a <= 1.1 * e, (name, a, e)


def test_shift_reads_hidden_in_place_and_leaves_the_last_position_without_gradient():
    h, w, t, _ = data(lead=(2, 9))
    got = grads(lambda h, w: slt.linear_cross_entropy(h, w, t, shift=True), h, w)
    assert (got[1][:, -1] == 0).all()
    ref = grads(lambda h, w: reference(h, w, t, shift=True), h, w)
    assert torch.allclose(got[1], ref[1], rtol=1e-10, atol=1e-12)


def test_return_lse_and_the_module():
    h, w, t, _ = data()
    loss, lse = slt.linear_cross_entropy(h, w, t, return_lse=True)
    assert torch.allclose(lse, torch.logsumexp(h @ w.t(), -1), rtol=1e-12)
    m = slt.LinearCrossEntropyLoss(label_smoothing=0.1)
    assert torch.allclose(m(h, w, t), reference(h, w, t, label_smoothing=0.1), rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_speed_gradients_scaled_in_place_once_then_again_alike(dtype):
    """speed computes the gradients in the forward (a reduced loss) and its backward scales them in
    place by the upstream gradient; a second backward through the graph (retain_graph) computes them
    again: the same bits, for any upstream gradient."""
    g = torch.Generator().manual_seed(5)
    h = torch.randn(2, 33, 16, generator=g).to(dtype).requires_grad_()
    w = torch.randn(40, 16, generator=g).to(dtype).requires_grad_()
    b = torch.randn(40, generator=g).to(dtype).requires_grad_()
    t = torch.randint(0, 40, (2, 33), generator=g)
    loss = slt.linear_cross_entropy(h, w, t, bias=b)
    first = torch.autograd.grad(3 * loss, (h, w, b), retain_graph=True)
    second = torch.autograd.grad(3 * loss, (h, w, b), retain_graph=True)
    assert all(torch.equal(x, y) for x, y in zip(first, second))
    one = torch.autograd.grad(loss, (h, w, b))
    assert all(torch.allclose((3 * y).double(), x.double(), rtol=1e-2, atol=1e-2 * y.abs().max().item())
               for x, y in zip(first, one))


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
def test_hidden_and_weight_of_any_layout(memory):
    """hidden and weight as transposed views (column-major rows): the loss and the gradients as from
    contiguous copies, in both forms (speed's backward scales its gradients in place as rows)."""
    h, w, t, b = data(bias=True)
    hc, wc = h.t().contiguous().t().requires_grad_(), w.t().contiguous().t().requires_grad_()
    assert hc.stride(-1) != 1 and wc.stride(-1) != 1
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    got = slt.linear_cross_entropy(hc, wc, t, bias=b, memory=memory)
    want = slt.linear_cross_entropy(h1, w1, t, bias=b, memory=memory)
    (3 * got).backward()
    (3 * want).backward()
    assert torch.equal(got, want)
    assert torch.allclose(hc.grad, h1.grad, rtol=1e-12, atol=1e-15)
    assert torch.allclose(wc.grad, w1.grad, rtol=1e-12, atol=1e-15)


def test_speed_backward_without_softlight_torch_imported():
    """The LM head's loss reached without softlight.torch imported first (as softlight.transformers
    reaches it): speed's backward scales its gradients in place all the same."""
    code = textwrap.dedent("""
        import sys
        import torch
        from softlight._linear import linear_cross_entropy
        assert "softlight.torch" not in sys.modules
        g = torch.Generator().manual_seed(0)
        h = torch.randn(2, 9, 16, generator=g, requires_grad=True)
        w = torch.randn(40, 16, generator=g, requires_grad=True)
        t = torch.randint(0, 40, (2, 9), generator=g)
        (2 * linear_cross_entropy(h, w, t)).backward()
        h64, w64 = (a.detach().double().requires_grad_() for a in (h, w))
        want = torch.nn.functional.cross_entropy((h64 @ w64.t()).flatten(0, 1), t.flatten())
        gh, gw = torch.autograd.grad(2 * want, (h64, w64))
        assert torch.allclose(h.grad.double(), gh, atol=1e-5) and torch.allclose(w.grad.double(), gw, atol=1e-5)
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_all_ignored_gives_nan_as_torch():
    h, w, t, _ = data()
    t[:] = -100
    assert torch.isnan(slt.linear_cross_entropy(h, w, t)) and torch.isnan(reference(h, w, t))


def test_bad_arguments_are_refused_by_name():
    h, w, t, _ = data()
    cases = [dict(memory="fast"), dict(reduction="avg"), dict(softcap=-1.0), dict(bias=torch.zeros(3)),
             dict(weight=w.float()), dict(target=t.double()), dict(target=t[:-1]), dict(weight=w[:, :-1])]
    for case in cases:
        kw = dict(case)
        ww, tt = kw.pop("weight", w), kw.pop("target", t)
        with pytest.raises(InvalidArgumentError):
            slt.linear_cross_entropy(h, ww, tt, **kw)


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
def test_a_target_outside_the_vocabulary_is_refused_on_the_cpu(memory):
    h, w, t, _ = data()
    for bad in (-1, w.shape[0]):
        tt = t.clone()
        tt[7] = bad
        with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
            slt.linear_cross_entropy(h, w, tt, memory=memory)
        with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
            slt.linear_row_stats(h, w, tt, memory=memory)


def stats_reference(h, w, idx, b=None, *, temperature=1.0, softcap=None, shift=False):
    if shift:
        h, idx = h[..., :-1, :], idx[..., 1:, ...] if idx.dim() == h.dim() - 1 else idx[..., 1:, :]
    z = h @ w.t()
    if b is not None:
        z = z + b
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    lp = torch.log_softmax(z / temperature, -1)
    ent = -(lp.exp() * lp).sum(-1)
    picked = lp.gather(-1, idx.unsqueeze(-1)).squeeze(-1) if idx.dim() == lp.dim() - 1 else lp.gather(-1, idx)
    return picked, ent


@pytest.mark.parametrize("opts", [dict(), dict(temperature=0.6), dict(softcap=2.5), dict(shift=True),
                                  dict(memory="low_memory"), dict(k=3)], ids=str)
def test_token_logprobs_and_entropy_against_float64(opts, narrow_vocab_chunks):
    opts = dict(opts)
    k = opts.pop("k", None)
    lead = (2, 12) if opts.get("shift") else (40,)
    h, w, _, b = data(bias=True, lead=lead)
    g = torch.Generator().manual_seed(9)
    idx = torch.randint(0, w.shape[0], lead + ((k,) if k else ()), generator=g)
    ref_opts = {key: v for key, v in opts.items() if key != "memory"}
    c1 = torch.randn(idx.shape, generator=g, dtype=torch.float64)
    c2 = torch.randn(lead, generator=g, dtype=torch.float64)

    def ours(h, w, b):
        out = slt.linear_row_stats(h, w, idx, bias=b, **opts)
        n = out["entropy"].shape
        return (out["logprobs"] * c1[..., :n[-1], :] if k else out["logprobs"] * c1[..., :n[-1]]).sum() + \
            (out["entropy"] * c2[..., :n[-1]]).sum()

    def ref(h, w, b):
        lp, ent = stats_reference(h, w, idx, b, **ref_opts)
        n = ent.shape
        return (lp * c1[..., :n[-1], :] if k else lp * c1[..., :n[-1]]).sum() + (ent * c2[..., :n[-1]]).sum()

    for a, r in zip(grads(ours, h, w, b), grads(ref, h, w, b)):
        assert torch.isfinite(a).all()
        assert torch.allclose(a, r, rtol=1e-10, atol=1e-12), (a - r).abs().max()
    lp = slt.linear_token_logprobs(h, w, idx, bias=b, **opts)
    assert torch.allclose(lp, stats_reference(h, w, idx, b, **ref_opts)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_row_stats_no_worse_than_torch_eager(dtype, memory, monkeypatch):
    """linear_row_stats from 16-bit inputs: a loss of the log-probs and entropies and its gradients err
    against float64, summed over twelve draws, at most 1.1 x torch eager's. (From float32 inputs the
    bias's gradient errs 1.18 x torch's: it sums the statistics kernel's gradient of the logits, whose
    formula rounds differently from torch's composite of log_softmax and the entropy; docs/consumers.md.)"""
    from softlight import _linear
    monkeypatch.setattr(_linear, "_LOW_MEMORY_CHUNK_BYTES", 256 * dtype.itemsize * 128)
    ours_err, eager_err = [0.0] * 4, [0.0] * 4
    for seed in range(3, 15):
        h, w, t, b = data(n=256, d=64, v=1000, dtype=dtype, bias=True, seed=seed)
        g = torch.Generator().manual_seed(seed)
        c1, c2 = (torch.randn(256, generator=g, dtype=torch.float64) for _ in range(2))

        def ours(h, w, b):
            o = slt.linear_row_stats(h, w, t, bias=b, memory=memory)
            return (o["logprobs"].double() * c1).sum() + (o["entropy"].double() * c2).sum()

        def ref(h, w, b):
            lp, ent = stats_reference(h, w, t, b)
            return (lp.double() * c1).sum() + (ent.double() * c2).sum()

        def eager(h, w, b):
            z = (h @ w.t() + b).float()
            lp = torch.log_softmax(z, -1)
            ent = -(lp.exp() * lp).sum(-1)
            return (lp.gather(-1, t[:, None])[:, 0].double() * c1).sum() + (ent.double() * c2).sum()

        exact = grads(ref, h.double(), w.double(), b.double())
        for i, (a, e, x) in enumerate(zip(grads(ours, h, w, b), grads(eager, h, w, b), exact)):
            ours_err[i] += (a.double() - x).abs().max().item()
            eager_err[i] += (e.double() - x).abs().max().item()
    for name, a, e in zip(("loss", "hidden", "weight", "bias"), ours_err, eager_err):
        assert a <= 1.1 * e, (name, a, e)


@pytest.mark.parametrize("chunks, over", [(2, 1.15), (4, 1.5), (8, 2.0)])
def test_why_the_weight_gradient_is_summed_in_float32(monkeypatch, chunks, over):
    """The reason for speed's float32 buffer (docs/consumers.md): the weight gradient summed in its own
    bfloat16 over token chunks errs over the 1.1 x torch eager's that the loss allows, already in two
    chunks (1.25 x, 1.74 x in four, 2.26 x in eight, at 4096 tokens, the max error summed over twelve
    draws), where the float32 sum errs as eager does."""
    from softlight import _linear
    monkeypatch.setattr(_linear, "_SPEED_CHUNKS", chunks)

    def err_ratio():
        ours, eager = 0.0, 0.0
        for seed in range(3, 15):
            h, w, t, _ = data(n=4096, d=64, v=1000, dtype=torch.bfloat16, seed=seed)
            exact = grads(lambda h, w: reference(h, w, t), h.double(), w.double())[2]
            ours += (grads(lambda h, w: slt.linear_cross_entropy(h, w, t), h, w)[2].double() - exact).abs().max().item()
            eager += (grads(lambda h, w: reference(h, w, t), h, w)[2].double() - exact).abs().max().item()
        return ours / eager

    assert err_ratio() <= 1.1
    real = _linear._TokenGrads.__init__

    def in_bf16(self, h2, weight, bias, need):
        real(self, h2, weight, bias, need)
        self._w = torch.zeros_like(weight)  # summed chunk after chunk in bfloat16

    monkeypatch.setattr(_linear._TokenGrads, "__init__", in_bf16)
    assert err_ratio() > over


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
def test_torch_compile_fullgraph_without_graph_breaks(memory):
    """Both functions are custom operators: torch.compile(fullgraph=True) takes them whole, forward and
    backward, and gives the eager results."""
    import torch._dynamo
    h, w, t, b = data(lead=(2, 12), bias=True)
    idx = t.clamp(min=0)

    def f(h, w, b):
        loss = slt.linear_cross_entropy(h, w, t, bias=b, shift=True, memory=memory, label_smoothing=0.1)
        st = slt.linear_row_stats(h, w, idx, bias=b, memory=memory, temperature=0.8)
        return loss + st["logprobs"].sum() + 0.5 * st["entropy"].sum()

    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(h, w, b).graph_break_count == 0
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for a, r in zip(grads(compiled, h, w, b), grads(f, h, w, b)):
        assert torch.allclose(a, r, rtol=1e-12, atol=1e-12)

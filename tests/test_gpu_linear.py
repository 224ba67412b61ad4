"""The LM head with its loss on the GPU (cuBLAS's matmuls, softlight's kernels): against float64 and
no worse than torch eager in 16 bits, in both memory forms; torch.compile(fullgraph=True); CUDA graph
capture; a target outside the vocabulary gives NaN."""
import pytest

from gpu_util import needs_gpu

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import softlight.torch as slt  # noqa: E402

pytestmark = needs_gpu


def _data(n, d, v, dtype, seed, bias=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(n, d, device="cuda", generator=g).to(dtype)
    w = (torch.randn(v, d, device="cuda", generator=g) / d ** 0.5).to(dtype)
    b = torch.randn(v, device="cuda", generator=g).to(dtype) if bias else None
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    return h, w, b, t


def _grads(fn, *xs):
    xs = [x.detach().clone().requires_grad_() for x in xs]
    loss = fn(*xs)
    loss.backward()
    return [loss.detach()] + [x.grad for x in xs]


def _eager(t):
    return lambda h, w, b: F.cross_entropy((h @ w.t() + b).float(), t)


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_no_worse_than_torch_eager(dtype, memory, monkeypatch):
    """Against float64 from the same inputs, the loss and the gradients to hidden, weight and bias err
    at most 1.1 x torch eager's (bf16/fp16 matmul, float32 loss), max |error| summed over six draws.
    low_memory in vocabulary chunks of 4096 words (eight for 32000)."""
    from softlight import _linear
    monkeypatch.setattr(_linear, "_LOW_MEMORY_CHUNK_BYTES", 2048 * 2 * 4096)
    ours_err, eager_err = [0.0] * 4, [0.0] * 4
    for seed in range(6):
        h, w, b, t = _data(2048, 512, 32000, dtype, seed)
        exact = _grads(_eager(t), h.double(), w.double(), b.double())
        ours = _grads(lambda h, w, b: slt.linear_cross_entropy(h, w, t, bias=b, memory=memory), h, w, b)
        eager = _grads(_eager(t), h, w, b)
        for i, (a, e, x) in enumerate(zip(ours, eager, exact)):
            assert torch.isfinite(a).all()
            ours_err[i] += (a.double() - x).abs().max().item()
            eager_err[i] += (e.double() - x).abs().max().item()
    for name, a, e in zip(("loss", "hidden", "weight", "bias"), ours_err, eager_err):
        assert a <= 1.1 * e, (name, a, e)


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
def test_float32_equals_float64_closely(memory):
    h, w, b, t = _data(300, 64, 5000, torch.float32, 7)
    t[::7] = -100
    ours = _grads(lambda h, w, b: slt.linear_cross_entropy(h, w, t, bias=b, memory=memory, label_smoothing=0.1,
                                                           z_loss=1e-3, softcap=20.0), h, w, b)

    def ref(h, w, b):
        z = h @ w.t() + b
        z = 20.0 * torch.tanh(z / 20.0)
        loss = F.cross_entropy(z, t, label_smoothing=0.1, reduction="none")
        keep = t != -100
        loss = loss + 1e-3 * torch.logsumexp(z, -1) ** 2 * keep
        return loss.sum() / keep.sum()

    for a, r in zip(ours, _grads(ref, h.double(), w.double(), b.double())):
        assert torch.allclose(a.double(), r, rtol=1e-4, atol=1e-6), (a.double() - r).abs().max()


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
def test_torch_compile_fullgraph_inductor(memory):
    import torch._dynamo
    h, w, b, t = _data(512, 128, 3000, torch.bfloat16, 3)
    h3, t3 = h.reshape(4, 128, 128), t.reshape(4, 128)

    def f(h, w, b):
        loss = slt.linear_cross_entropy(h, w, t3, bias=b, shift=True, memory=memory)
        st = slt.linear_row_stats(h, w, t3, bias=b, memory=memory)
        return loss + st["logprobs"].float().mean() + st["entropy"].float().mean()

    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(h3, w, b).graph_break_count == 0
    compiled = torch.compile(f, fullgraph=True)
    for a, r in zip(_grads(compiled, h3, w, b), _grads(f, h3, w, b)):
        assert torch.allclose(a.float(), r.float(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
def test_cuda_graph_capture(memory):
    """Forward and backward captured in a CUDA graph and replayed on new inputs copied into the
    captured ones: the eager results."""
    h, w, b, t = _data(256, 64, 2000, torch.bfloat16, 5)
    hs, ws, bs = (x.detach().clone().requires_grad_() for x in (h, w, b))
    ts = t.clone()

    def step():
        for x in (hs, ws, bs):
            x.grad = None
        loss = slt.linear_cross_entropy(hs, ws, ts, bias=bs, memory=memory)
        loss.backward()
        return loss

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    for x in (hs, ws, bs):
        x.grad = None
    with torch.cuda.graph(graph):
        loss = step()
    h2, w2, b2, t2 = _data(256, 64, 2000, torch.bfloat16, 6)
    with torch.no_grad():
        hs.copy_(h2), ws.copy_(w2), bs.copy_(b2), ts.copy_(t2)
    graph.replay()
    torch.cuda.synchronize()
    want = _grads(lambda h, w, b: slt.linear_cross_entropy(h, w, t2, bias=b, memory=memory), h2, w2, b2)
    for a, r in zip([loss, hs.grad, ws.grad, bs.grad], want):
        assert torch.equal(a, r)


@pytest.mark.parametrize("memory", ["speed", "low_memory"])
def test_a_target_outside_the_vocabulary_gives_nan(memory):
    h, w, b, t = _data(64, 32, 500, torch.float32, 9)
    t[5] = 500
    assert torch.isnan(slt.linear_cross_entropy(h, w, t, bias=b, memory=memory))
    assert torch.isnan(slt.linear_cross_entropy(h, w, t, bias=b, memory=memory, reduction="none")[5])


def test_both_float32_sums_of_the_weight_gradient_agree(monkeypatch):
    """The weight gradient's float32 sum over token chunks, in place (addmm with out_dtype into the
    sum) and through a float32 product added after (taken where this torch's in-place form fails its
    check), give the same gradients."""
    from softlight import _linear
    h, w, b, t = _data(1024, 128, 5000, torch.bfloat16, 11)
    assert _linear._in_place_ok(h.device) in (True, False)
    results = []
    for ok in (True, False):
        monkeypatch.setitem(_linear._IN_PLACE_OK, h.device, ok)
        results.append(_grads(lambda h, w, b: slt.linear_cross_entropy(h, w, t, bias=b), h, w, b))
    for a, r in zip(*results):
        assert torch.allclose(a.float(), r.float(), rtol=1e-2, atol=1e-6)

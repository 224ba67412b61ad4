"""The plain API and torch's autograd: no silent wrong gradient (docs/semantics.md, "Autograd and
arrays written in place"), and the double backward of softlight.torch's cross-entropy."""
import pytest

torch = pytest.importorskip("torch")
import softlight  # noqa: E402
import softlight.torch as slt  # noqa: E402


DEVICES = ["cpu"] + [pytest.param("cuda", marks=pytest.mark.gpu)] * torch.cuda.is_available()


@pytest.mark.parametrize("device", DEVICES)
def test_plain_api_refuses_tensors_that_require_grad(device):
    x = torch.randn(3, 5, dtype=torch.float64, device=device, requires_grad=True)
    t = torch.tensor([0, 1, 2], device=device)
    entries = [lambda: softlight.log_softmax(x), lambda: softlight.log_softmax_backward(x, x.detach()),
               lambda: softlight.log_softmax_backward(x.detach(), x), lambda: softlight.entropy(x),
               lambda: softlight.cross_entropy(x, t), lambda: softlight.logsumexp(x),
               lambda: softlight.token_logprobs(x, t), lambda: softlight.row_stats(x)]
    for fn in entries:
        with pytest.raises(softlight.InvalidArgumentError, match="softlight.torch"):
            fn()
    with torch.no_grad():  # no graph wanted: computed
        assert torch.allclose(softlight.log_softmax(x), torch.log_softmax(x, -1))
    assert torch.allclose(softlight.log_softmax(x.detach()), torch.log_softmax(x.detach(), -1))


@pytest.mark.parametrize("device", DEVICES)
def test_writes_bump_the_version_and_outputs_that_require_grad_are_refused(device):
    # y saved by exp's backward, overwritten in place.
    x = torch.randn(3, 5, dtype=torch.float64, device=device, requires_grad=True)
    y = x.exp()
    with pytest.raises(softlight.InvalidArgumentError):
        softlight.log_softmax(y, out=y)  # y requires grad
    # The same write through a detached view: autograd sees it and raises, as for torch's own.
    w = torch.randn(3, 5, dtype=torch.float64, device=device, requires_grad=True)
    q = w.exp()
    before = q._version
    softlight.log_softmax(q.detach(), out=q.detach())
    assert q._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(q.sum(), w)
    # grad= and out= of the consumers, grad_in= of the backward, likewise.
    logits = torch.randn(4, 6, dtype=torch.float64, device=device)
    t = torch.tensor([0, 1, 2, 3], device=device)
    g = torch.empty_like(logits)
    v = g._version
    softlight.cross_entropy(logits, t, grad=g)
    assert g._version > v
    v = g._version
    softlight.log_softmax_backward(logits, softlight.log_softmax(logits), grad_in=g)
    assert g._version > v
    out = torch.empty(4, 6, dtype=torch.float64, device=device, requires_grad=True)
    with pytest.raises(softlight.InvalidArgumentError, match="requires grad"):
        softlight.log_softmax(logits, out=out)
    with pytest.raises(softlight.InvalidArgumentError, match="requires grad"):
        softlight.cross_entropy(logits, t, grad=out)
    y = torch.empty_like(logits)  # the GPU's inline path: out= a plain tensor, its version bumped
    v = y._version
    softlight.log_softmax(logits, out=y)
    assert y._version > v and torch.allclose(y, torch.log_softmax(logits, -1))


@pytest.mark.parametrize("kw", [dict(), dict(label_smoothing=0.1, z_loss=1e-2, temperature=1.5),
                                dict(reduction="sum", ignore_index=2), dict(reduction="none")],
                         ids=["mean", "smoothing-zloss-T", "sum-ignore", "none"])
def test_cross_entropy_double_backward(kw):
    """gradgradcheck in float64: a gradient penalty through softlight.torch.cross_entropy is the
    same as through torch's (the gradient has a graph, and its own gradient is right)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 7, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 7, (5,), generator=g)
    t[1] = kw.get("ignore_index", -100)
    f = lambda a: slt.cross_entropy(a, t, **kw)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,)) and torch.autograd.gradgradcheck(f, (x,))
    loss = f(x).sum()
    gx, = torch.autograd.grad(loss, x, create_graph=True)
    assert gx.requires_grad
    if not kw.get("z_loss") and kw.get("temperature", 1.0) == 1.0:
        want = torch.nn.functional.cross_entropy(x, t, **{k: v for k, v in kw.items()}).sum()
        wx, = torch.autograd.grad(want, x, create_graph=True)
        p1, = torch.autograd.grad((gx ** 2).sum(), x)
        p2, = torch.autograd.grad((wx ** 2).sum(), x)
        assert torch.allclose(p1, p2, rtol=1e-10, atol=1e-12)
    lse_x = x.detach().clone().requires_grad_()
    _, lse = slt.cross_entropy(lse_x, t, return_lse=True, **kw)
    assert torch.autograd.gradgradcheck(lambda a: slt.cross_entropy(a, t, return_lse=True, **kw)[1], (lse_x,))


def test_cross_entropy_weight_as_torch():
    g = torch.Generator().manual_seed(4)
    for kw in (dict(), dict(label_smoothing=0.2), dict(reduction="sum", ignore_index=1), dict(reduction="none")):
        x = torch.randn(6, 9, generator=g, dtype=torch.float64, requires_grad=True)
        t = torch.randint(0, 9, (6,), generator=g)
        t[2] = kw.get("ignore_index", -100)
        w = torch.rand(9, generator=g, dtype=torch.float64)
        got = slt.cross_entropy(x, t, w, **kw)
        want = torch.nn.functional.cross_entropy(x, t, w, **kw)
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-14), kw
        a, = torch.autograd.grad(got.sum(), x)
        b, = torch.autograd.grad(want.sum(), x)
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14), kw
        # CrossEntropyLoss in torch's positional order.
        mod = slt.CrossEntropyLoss(w, kw.get("ignore_index", -100), kw.get("reduction", "mean"),
                                   kw.get("label_smoothing", 0.0))
        ref = torch.nn.CrossEntropyLoss(w, None, kw.get("ignore_index", -100), None, kw.get("reduction", "mean"),
                                        kw.get("label_smoothing", 0.0))
        assert torch.allclose(mod(x, t), ref(x, t), rtol=1e-12, atol=1e-14)


def test_zero_size_vocabulary_and_lists():
    x = torch.randn(3, 0)
    assert torch.equal(slt.logsumexp(x), torch.logsumexp(x, -1))
    assert slt.entropy(x).shape == (3,)
    assert slt.cross_entropy(torch.randn(0, 5), torch.zeros(0, dtype=torch.long), reduction="none").shape == (0,)
    y = torch.randn(3, 5)
    assert torch.equal(slt.cross_entropy(y, [0, 1, 2]), slt.cross_entropy(y, torch.tensor([0, 1, 2])))
    assert torch.equal(slt.token_logprobs(y[0], 3), slt.token_logprobs(y[0], torch.tensor(3)))

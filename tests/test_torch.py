"""softlight.torch: the torch operators with autograd (gradcheck, double backward), fake kernels
(opcheck), torch.compile with no graph break (static and dynamic shapes), autocast, non-contiguous
inputs and every dim. On the CPU everywhere torch is installed; on the GPU too where there is one."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import softlight.torch as slt  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradcheck_and_double_backward(device, dim, temperature):
    x = torch.randn(5, 7, dtype=torch.float64, device=device, requires_grad=True)
    f = lambda t: torch.ops.softlight.log_softmax(t, dim, temperature)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))


@pytest.mark.parametrize("device", DEVICES)
def test_eager_autograd_equals_the_operators(device):
    """softlight.torch.log_softmax under eager autograd (an autograd.Function over the operators'
    kernels) gives the operator's values and gradients bit for bit, double backward included."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 300, generator=g).to(device).requires_grad_()
    w = torch.randn(6, 300, generator=g).to(device)
    for dim, t in ((-1, 1.0), (0, 0.7)):
        y = slt.log_softmax(x, dim, temperature=t)
        assert y.grad_fn is not None and "LogSoftmaxGrad" in type(y.grad_fn).__name__
        z = torch.ops.softlight.log_softmax(x, dim, t)
        assert torch.equal(y, z)
        gy, = torch.autograd.grad(y, x, w, create_graph=True)
        gz, = torch.autograd.grad(z, x, w, create_graph=True)
        assert torch.equal(gy, gz)
        hy, = torch.autograd.grad((gy * gy).sum(), x)
        hz, = torch.autograd.grad((gz * gz).sum(), x)
        assert torch.equal(hy, hz)
    xd = x.detach().double().requires_grad_()
    assert torch.autograd.gradcheck(lambda a: slt.log_softmax(a, 1, temperature=1.3),
                                    (xd[:3, :20].detach().requires_grad_(),))
    assert torch.autograd.gradgradcheck(lambda a: slt.log_softmax(a, 0), (xd[:3, :20].detach().requires_grad_(),))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_every_operator(device):
    x = torch.randn(3, 9, device=device)
    y = torch.log_softmax(x, 1)
    for op, args in [(torch.ops.softlight.log_softmax.default, (x, 1, 1.0)),
                     (torch.ops.softlight.log_softmax.default, (x.t(), 0, 2.0)),
                     (torch.ops.softlight.log_softmax_backward.default, (torch.randn_like(y), y, 1, 1.0))]:
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_forward_and_backward_equal_torchs(device, dtype):
    x = torch.randn(6, 4, 50, device=device, dtype=dtype)
    for dim in range(-3, 3):
        for view in (x, x.transpose(0, 2), x[:, ::2]):
            a = view.detach().clone().requires_grad_(True)
            b = view.detach().clone().requires_grad_(True)
            ya, yb = slt.log_softmax(a, dim), torch.log_softmax(b, dim)
            g = torch.randn_like(ya)
            (ya * g).sum().backward()
            (yb * g).sum().backward()
            tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(ya, yb, **tol)
            if dtype != torch.bfloat16:
                torch.testing.assert_close(a.grad, b.grad, **tol)
                continue
            # In bfloat16 each implementation rounds y, an ulp apart at times, and the gradient
            # g - exp(y) sum(g) multiplies that by |sum(g)|: softlight's gradient is checked against
            # float64 arithmetic on its own y and g instead (one rounding to bfloat16, 2^-9 relative).
            yd, gd = ya.detach().double(), g.double()
            ref = gd - yd.exp() * gd.sum(dim, keepdim=True)
            torch.testing.assert_close(a.grad.double(), ref, atol=1e-4, rtol=4e-3)
    assert torch.equal(slt.LogSoftmax(dim=1)(x), slt.log_softmax(x, 1))


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_has_no_graph_breaks(dynamic):
    def f(t):
        return (slt.log_softmax(t * 2, -1) * t).sum()
    x = torch.randn(4, 33, requires_grad=True)
    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    out = compiled(x)
    out.backward()
    g = x.grad.clone()
    x.grad = None
    f(x).backward()
    torch.testing.assert_close(out, f(x))
    torch.testing.assert_close(g, x.grad)
    for shape in [(4, 33), (7, 10), (2, 3, 5)]:  # new shapes: recompiled (or dynamic), never broken
        t = torch.randn(shape)
        torch.testing.assert_close(compiled(t), f(t))
    assert torch._dynamo.explain(f)(x).graph_break_count == 0


def test_autocast_as_torch_log_softmax():
    """Under CPU autocast torch.log_softmax keeps its input's dtype (CUDA autocast makes it float32:
    tests/test_gpu.py); softlight's does the same."""
    x = torch.randn(4, 16)
    for dtype in (torch.bfloat16, torch.float32):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = slt.log_softmax(x.to(dtype), -1)
            want = torch.log_softmax(x.to(dtype), -1)
        assert y.dtype == want.dtype == dtype
        torch.testing.assert_close(y, want)


def test_temperature_gradient_is_scaled():
    x = torch.randn(3, 11, dtype=torch.float64, requires_grad=True)
    y = slt.log_softmax(x, -1, temperature=3.0)
    torch.testing.assert_close(y, torch.log_softmax(x / 3.0, -1))
    g = torch.randn_like(y)
    (dx,) = torch.autograd.grad((y * g).sum(), x)
    x2 = x.detach().requires_grad_(True)
    (dx2,) = torch.autograd.grad((torch.log_softmax(x2 / 3.0, -1) * g).sum(), x2)
    torch.testing.assert_close(dx, dx2)


def test_errors_are_softlights():
    import softlight
    with pytest.raises(softlight.AxisError):
        slt.log_softmax(torch.randn(2, 3), 2)
    with pytest.raises(softlight.UnsupportedDTypeError):
        slt.log_softmax(torch.ones(2, 3, dtype=torch.int32), 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("shape", [(8, 1000), (8, 65536), (2, 1000000)])  # rows in registers, clusters, a grid
def test_cuda_graph_capture_and_replay(shape):
    """The operators and softlight.log_softmax on torch's current stream, captured into a CUDA graph
    and replayed on new values, give what eager torch gives for those values, and bit for bit what
    softlight's eager calls give."""
    import softlight
    x = torch.randn(shape, device="cuda")
    g = torch.randn(shape, device="cuda")
    out = torch.empty_like(x)
    for _ in range(2):  # warm: the first calls set up what a capture may not
        slt.log_softmax(x, -1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = torch.ops.softlight.log_softmax(x, -1, 1.0)
        dx = torch.ops.softlight.log_softmax_backward(g, y, -1, 1.0)
        softlight.log_softmax(x * 2, out=out)
    for _ in range(3):
        x.copy_(torch.randn(shape, device="cuda") * 3)
        g.copy_(torch.randn(shape, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        ref = torch.log_softmax(x.double(), -1)
        torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(dx.double(), g.double() - ref.exp() * g.double().sum(-1, keepdim=True),
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.double(), torch.log_softmax(2 * x.double(), -1), atol=1e-5, rtol=1e-5)
        # Replay is the eager call, bit for bit (the kernels are deterministic).
        eager = torch.ops.softlight.log_softmax(x, -1, 1.0)
        assert torch.equal(y, eager)
        assert torch.equal(dx, torch.ops.softlight.log_softmax_backward(g, eager, -1, 1.0))
        assert torch.equal(out, softlight.log_softmax(x * 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inductor's CUDA backend needs a CUDA GPU")
def test_compile_inductor_on_the_gpu():
    """A model step compiled by inductor (fullgraph) on the GPU: softlight's operators stay in the
    graph, and the loss and gradients are torch's."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(32000, 64, device="cuda")
    head = torch.nn.Linear(64, 32000, device="cuda")

    def loss(tokens, targets, logsm):
        logits = head(torch.tanh(emb(tokens)))
        return -logsm(logits).gather(-1, targets[..., None]).mean()
    tokens = torch.randint(0, 32000, (4, 16), device="cuda")
    targets = torch.randint(0, 32000, (4, 16), device="cuda")
    compiled = torch.compile(lambda a, b: loss(a, b, lambda t: slt.log_softmax(t, -1)), fullgraph=True)
    got = compiled(tokens, targets)
    got.backward()
    grads = [p.grad.clone() for p in (emb.weight, head.weight)]
    for p in (emb.weight, head.weight):
        p.grad = None
    want = loss(tokens, targets, lambda t: torch.log_softmax(t, -1))
    want.backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, p in zip(grads, (emb.weight, head.weight)):
        torch.testing.assert_close(a, p.grad, atol=1e-5, rtol=1e-4)


def _general(x, dim, t):
    """The general path's result (the DLPack API on a contiguous copy)."""
    from softlight import _api
    return _api.log_softmax(x.contiguous(), dim, temperature=t)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_eager_path_in_c_equals_the_general_path(device, dtype):
    """softlight.torch's eager calls read in C (_C.torch_forward / torch_backward) give the general
    path's results bit for bit, over shapes with empty, single and many-element axes, every dim and
    a temperature; the inputs, poisoned outputs aside, are left as they were."""
    from softlight import _C, _api
    g = torch.Generator().manual_seed(5)
    for shape in [(), (0,), (7,), (3, 1, 5), (2, 0, 4), (1, 1), (4, 300), (2, 3, 257)]:
        x = (torch.randn(shape, generator=g) * 4).to(dtype).to(device)
        if x.numel() > 2:
            x.view(-1)[:3] = torch.tensor([float("inf"), -float("inf"), float("nan")], dtype=dtype)
        x0 = x.clone()
        for dim in range(-max(x.dim(), 1), max(x.dim(), 1)):
            for t in (1.0, 0.7):
                y = _C.torch_forward(x, dim, t, True)
                assert y is not None and y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
                want = _general(x, dim, t)
                assert torch.equal(y.nan_to_num(7.0), want.nan_to_num(7.0))
                assert torch.equal(y.isnan(), want.isnan())
                assert torch.equal(slt.log_softmax(x, dim, temperature=t).nan_to_num(7.0), want.nan_to_num(7.0))
                gr = torch.randn(shape, generator=g).to(dtype).to(device)
                dx = _C.torch_backward(gr, want, dim)
                assert dx is not None
                ref = _api.log_softmax_backward(gr, want, dim)
                assert torch.equal(dx.nan_to_num(7.0), ref.nan_to_num(7.0)) and torch.equal(dx.isnan(), ref.isnan())
        assert torch.equal(x.nan_to_num(7.0), x0.nan_to_num(7.0))


@pytest.mark.parametrize("device", DEVICES)
def test_the_c_reader_reads_a_tensor_as_its_attributes_say(device):
    """_C.torch_read, softlight's one reader of torch tensors, gives each tensor's pointer, shape,
    strides, dtype code, device and current stream as torch's attributes give them, for every layout,
    dtype and subclass; and None for those it does not take, which _arrays.read_torch refuses by name."""
    import softlight
    from softlight import _C, _arrays
    base = torch.randn(6, 8, 10, device=device)
    codes = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}
    tensors = [base, base.transpose(0, 2), base[1:5:2, ::3], base[0, 0, 0], base[:, :0], base[:, 2:3].expand(6, 5, 10),
               torch.nn.Parameter(base.clone()), base.requires_grad_(False).to(torch.float64)] + \
        [base.to(dt)[::2] for dt in (torch.float16, torch.bfloat16)]
    for t in tensors:
        dev = t.get_device()
        stream = torch.cuda.current_stream(dev).cuda_stream if t.is_cuda else None
        want = ((t.data_ptr(), tuple(t.shape), t.stride(), codes[t.dtype], t.is_cuda, max(dev, 0), False, "torch",
                 None), stream)
        got = _C.torch_read(t)
        assert (tuple(got[0][:1]) + (tuple(got[0][1]),) + tuple(got[0][2:]), got[1]) == want
        assert _arrays.read_torch(t, None) == got
    refused = {"unsupported dtype int32": torch.ones(2, 3, dtype=torch.int32),
               "unsupported dtype complex64": torch.ones(2, 3, dtype=torch.complex64),
               "torch.sparse_coo tensors are not supported": torch.eye(3).to_sparse(),
               "negative bit": torch._neg_view(torch.randn(2, 3)),
               "tensors on meta are not supported": torch.empty(2, 3, device="meta")}
    for what, t in refused.items():
        assert _C.torch_read(t) is None, what
        with pytest.raises((softlight.InvalidArgumentError, softlight.UnsupportedDTypeError), match=what):
            softlight.log_softmax(t)
    assert _C.torch_read(base.numpy() if device == "cpu" else 3) is None


@pytest.mark.parametrize("device", DEVICES)
def test_the_plain_api_writes_out_in_c_as_the_general_path_does(device):
    """softlight.log_softmax(x, out=o) on torch tensors, written in C where it can be: o itself comes
    back with the general path's values (x itself, strided outs and outs of every dtype), autograd's
    version of o is bumped, and an out softlight must not write is refused by name, nothing written."""
    import softlight
    from softlight import _C, _api
    g = torch.Generator().manual_seed(11)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        x = (torch.randn(5, 300, generator=g) * 3).to(dtype).to(device)
        x.view(-1)[:3] = torch.tensor([float("inf"), -float("inf"), float("nan")], dtype=dtype)
        want = _api.log_softmax(x.clone(), -1)
        for o in (torch.full_like(x, 7.0), torch.full((300, 5), 7.0, dtype=dtype, device=device).t()):
            ref = torch.full_like(o, 5.0)
            softlight.log_softmax(x, -1, out=ref, return_lse=True)  # (return_lse: the general path)
            v = o._version
            assert softlight.log_softmax(x, -1, out=o) is o
            assert torch.equal(o.nan_to_num(9.0), ref.nan_to_num(9.0)) and torch.equal(o.isnan(), ref.isnan())
            assert o._version > v
        o = torch.full_like(x, 7.0)
        assert _C.torch_forward(x, 0, 1.0, False, o) is o
        assert torch.equal(o.nan_to_num(9.0), _api.log_softmax(x.clone(), 0).nan_to_num(9.0))
        ot = torch.full((300, 5), 7.0, dtype=dtype, device=device).t()
        assert _C.torch_forward(x, -1, 1.0, False, ot) is ot  # (strides the C ABI writes in place)
        xi = x.clone()
        assert softlight.log_softmax(xi, -1, out=xi) is xi
        assert torch.equal(xi.nan_to_num(9.0), want.nan_to_num(9.0))
    # Outs whose axes before or after dim do not merge: left to the general path, which writes them
    # through a contiguous result, on every call.
    x = torch.randn(4, 5, 6, generator=g).to(device)
    for o in (torch.empty(5, 4, 6, device=device).transpose(0, 1),
              torch.empty(6, 5, 4, device=device).permute(2, 1, 0)):
        for dim in (0, 1, 2, -1):
            ref = torch.full_like(o, 5.0)
            softlight.log_softmax(x, dim, out=ref, return_lse=True)
            for _ in range(2):
                o.fill_(7.0)
                assert softlight.log_softmax(x, dim, out=o) is o
                assert torch.equal(o, ref)
            merged = _C.layout(o.shape, o.stride(), dim)[0] == 0
            assert _C.torch_forward(x, dim, 1.0, False, o) is (o if merged else None)
    x = torch.randn(4, 6, device=device)
    for what, o in {"dtype": torch.zeros(4, 6, dtype=torch.float64, device=device),
                    "shape": torch.zeros(4, 5, device=device), "subclass": torch.nn.Parameter(torch.zeros(4, 6)),
                    "requires grad": torch.zeros(4, 6, device=device, requires_grad=True)}.items():
        assert _C.torch_forward(x, -1, 1.0, False, o) is None, what
    o = torch.zeros(4, 6, device=device, requires_grad=True)
    with pytest.raises(softlight.InvalidArgumentError, match="out requires grad"):
        softlight.log_softmax(x, -1, out=o)
    assert not o.detach().any()
    with pytest.raises(softlight.InvalidArgumentError, match="out has dtype float64"):
        softlight.log_softmax(x, -1, out=torch.zeros(4, 6, dtype=torch.float64, device=device))
    with pytest.raises(softlight.AxisError, match="dim 2 is out of range"):
        softlight.log_softmax(x, 2, out=torch.zeros(4, 6, device=device))
    with torch.no_grad():  # (written in place where autograd records nothing, as torch's out=)
        assert softlight.log_softmax(x, -1, out=o) is o
    torch.testing.assert_close(o.detach(), torch.log_softmax(x, -1))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_eager_path_in_c_leaves_to_the_general_path_what_it_must():
    """None (the general path takes the call) for everything the C path must not take as it is, True
    where autograd is to record a plain call; and then softlight.torch still gives the right result,
    or softlight's error."""
    from softlight import _C
    from torch.utils._python_dispatch import TorchDispatchMode
    x = torch.randn(4, 6)
    assert _C.torch_forward(x, -1, 1.0, True) is not None
    refused = {
        "subclass": (torch.nn.Parameter(x), -1, 1.0),
        "not contiguous": (x.t(), 0, 1.0),
        "negative bit": (torch._neg_view(x), -1, 1.0),
        "int dtype": (torch.ones(2, 3, dtype=torch.int32), -1, 1.0),
        "complex dtype": (torch.ones(2, 3, dtype=torch.complex64), -1, 1.0),
        "meta": (torch.empty(2, 3, device="meta"), -1, 1.0),
        "dim out of range": (x, 2, 1.0),
        "dim not an int": (x, 1.0, 1.0),
        "temperature an int": (x, -1, 2),
        "temperature zero": (x, -1, 0.0),
        "temperature inf": (x, -1, float("inf")),
        "temperature nan": (x, -1, float("nan")),
        "not a tensor": (x.numpy(), -1, 1.0),
    }
    for what, (a, dim, t) in refused.items():
        assert _C.torch_forward(a, dim, t, True) is None, what
        assert _C.torch_forward(a, dim, t, False) is None, what

    xg = x.clone().requires_grad_()
    assert _C.torch_forward(xg, -1, 1.0, True) is True  # plain, but autograd is to record it
    assert _C.torch_forward(xg, -1, 1.0, False) is not None  # (below autograd)
    with torch.no_grad():
        assert _C.torch_forward(xg, -1, 1.0, True) is not None
    # With grad wanted, a plain call is True whatever its layout: the Function's forward reads it, or
    # leaves it to the general path.
    xt = x.t().clone().requires_grad_()
    assert not xt.is_contiguous() and _C.torch_forward(xt, 0, 1.0, True) is True
    (dx,) = torch.autograd.grad(slt.log_softmax(xt, 0), xt, torch.ones(6, 4))
    torch.testing.assert_close(dx, 1 - 6 * torch.softmax(xt.detach(), 0))

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen() as mode:
        assert _C.torch_forward(x, -1, 1.0, True) is None
        y = slt.log_softmax(x, -1)
    assert any("softlight.log_softmax" in op for op in mode.ops), mode.ops  # the mode sees the operator
    torch.testing.assert_close(y, torch.log_softmax(x, -1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _C.torch_forward(x, -1, 1.0, True) is None
    seen = []
    torch.func.vmap(lambda r: seen.append(_C.torch_forward(r, -1, 1.0, True)) or r)(x)
    assert seen == [None]
    traced = torch.jit.trace(lambda a: slt.log_softmax(a, -1) * 2, (x,))  # the tracer records the operator
    z = torch.randn(4, 6)
    torch.testing.assert_close(traced(z), torch.log_softmax(z, -1) * 2)
    # Backward: mismatched pairs are left to the general path, which says what is wrong.
    y = torch.log_softmax(x, -1)
    for what, (gr, yy) in {"dtype": (x.double(), y), "shape": (x[:2], y), "layout": (x.t(), y.t()),
                           "subclass": (torch.nn.Parameter(x), y)}.items():
        assert _C.torch_backward(gr, yy, -1) is None, what
    import softlight
    with pytest.raises(softlight.InvalidArgumentError):
        torch.ops.softlight.log_softmax_backward(x[:2], y, -1)

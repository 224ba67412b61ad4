"""The examples a user would copy, run small: the language model trained under
torch.compile(fullgraph=True) with torch's log-softmax and with softlight's (examples/torch/train_lm.py)
must give the same loss at every step, within 1e-3 relative. On the CPU with the aot_eager backend
(fast to compile); on the GPU with inductor, as users run it."""
import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torch" / "train_lm.py"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _example():
    spec = importlib.util.spec_from_file_location("train_lm", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("device", DEVICES)
def test_training_losses_follow_torchs(device):
    ex = _example()
    kw = dict(vocab=32000, d=32, layers=1, heads=2, context=16, batch=4, steps=8, device=device,
              backend="aot_eager" if device == "cpu" else "inductor")
    runs = ex.train(ex.LOSSES, **kw)
    ref = runs["torch"][0]
    assert ref[-1] < ref[0]  # it learns
    for name in ("softlight", "softlight-fused"):
        ours = runs[name][0]
        assert len(ref) == len(ours) == 8 == len(runs[name][1])
        for a, b in zip(ref, ours):
            assert abs(a - b) <= 1e-3 * abs(a), (name, ref, ours)


def test_log_softmax_time_from_the_profiler():
    """The example's --profile path on the CPU: softlight's log-softmax is found in the profile (its
    operator), and takes part of the step, not all of it."""
    ex = _example()
    kw = dict(vocab=1000, d=32, layers=1, heads=2, context=16, batch=4, steps=3, device="cpu", backend="aot_eager")
    for name, loss in ex.LOSSES.items():
        torch._dynamo.reset()
        ls, total = ex.log_softmax_time(loss, **kw)
        assert 0 < ls < total, (name, ls, total)

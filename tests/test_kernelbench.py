"""The KernelBench drop-in: ModelNew agrees with Model on 5 random trials at atol = rtol = 1e-4."""
import importlib.util
from pathlib import Path


from gpu_util import needs_gpu, torch

PATH = Path(__file__).resolve().parents[1] / "examples" / "kernelbench" / "24_LogSoftmax.py"


@needs_gpu
def test_model_new_matches_model_on_five_trials():
    spec = importlib.util.spec_from_file_location("kb24", PATH)
    kb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kb)
    model, model_new = kb.Model(*kb.get_init_inputs()).cuda(), kb.ModelNew(*kb.get_init_inputs()).cuda()
    for trial in range(5):
        torch.manual_seed(1000 + trial + int(torch.randint(0, 1 << 30, ()).item()))
        (x,) = [t.cuda() for t in kb.get_inputs()]
        ref = model(x)
        new = model_new(x)
        torch.testing.assert_close(new, ref, atol=1e-4, rtol=1e-4)
        del x, ref, new
        torch.cuda.empty_cache()

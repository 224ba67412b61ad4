"""GPU-visible time of softlight's Python call on torch tensors against the raw entry the bench
times and a copy, at 1 GB shapes, from an idle stream as the bench times them (three rounds over the
providers in turn; medians). The difference is the Python call's host work:

    python tools/api_time.py
"""
import sys
import numpy as np
import torch
import softlight
from softlight._device import Gpu

gpu = Gpu(0)
ext = torch.cuda.ExternalStream(gpu.handle)
shapes = [(15259, 32768, "bfloat16"), (7629, 65536, "bfloat16"), (682, 393216, "float32"),
          (1953125, 128, "float32"), (2500000, 100, "float32"), (122070, 4096, "bfloat16")]
for rows, cols, dt in shapes:
    with torch.cuda.stream(ext):
        x = (torch.randn(rows, cols, device="cuda") * 3).to(getattr(torch, dt))
        nbytes = x.numel() * x.element_size()
        def copy():
            o = torch.empty_like(x); gpu.copy(o.data_ptr(), x.data_ptr(), nbytes); return o
        def raw():
            o = torch.empty_like(x)
            softlight.log_softmax_raw(x.data_ptr(), o.data_ptr(), rows, cols, dtype=dt, stream=gpu.handle); return o
        def api():
            return softlight.log_softmax(x)
        res = {"copy": [], "raw": [], "api": []}
        for r in range(3):
            for k, fn in (("copy", copy), ("raw", raw), ("api", api)):
                res[k].append(gpu.time_ms(fn, 3, 10))
    m = {k: float(np.median(v)) for k, v in res.items()}
    print(f"{rows}x{cols} {dt:9s} copy {m['copy']:.4f} ms  raw {m['raw']:.4f} ms ({m['raw']/m['copy']:.3f} x)  "
          f"log_softmax(x) {m['api']:.4f} ms ({m['api']/m['copy']:.3f} x)", flush=True)
    del x
    torch.cuda.empty_cache()

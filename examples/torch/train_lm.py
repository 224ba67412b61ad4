"""Train a small causal transformer language model on synthetic tokens under
torch.compile(fullgraph=True), from the same seed, with three losses, and print the loss curves and
step times side by side:

- "torch": torch.log_softmax, then the negative log-likelihood (F.nll_loss) of the next token;
- "softlight": softlight.torch.log_softmax, then F.nll_loss;
- "softlight-fused": softlight.torch.cross_entropy, the same loss in one pass over the logits that
  also writes their gradient (docs/consumers.md).

    python examples/torch/train_lm.py                    # on the GPU if there is one
    python examples/torch/train_lm.py --steps 50 --device cpu --backend aot_eager
    python examples/torch/train_lm.py --profile 20      # and each run's log-softmax time (torch.profiler)

The tokens follow a rule the model can learn (each is a fixed function of the one before, with some
noise), so the loss falls. The loss is the only thing that differs between runs.
"""
import argparse
import time

import torch
import torch.nn.functional as F

import softlight.torch as slt


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, h):
        b, t, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return h + self.mlp(self.norm2(h))


class LM(torch.nn.Module):
    def __init__(self, vocab, d, layers, heads, context):
        super().__init__()
        self.tokens, self.positions = torch.nn.Embedding(vocab, d), torch.nn.Embedding(context, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)

    def forward(self, tokens):
        h = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def batches(vocab, batch, context, steps, seed, device):
    """Synthetic sequences: token[i + 1] = (7 token[i] + 3) mod vocab, one in ten replaced at random."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        t = torch.empty(batch, context + 1, dtype=torch.long)
        t[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        for i in range(context):
            t[:, i + 1] = (7 * t[:, i] + 3) % vocab
        noise = torch.rand(batch, context + 1, generator=g) < 0.1
        t[noise] = torch.randint(0, vocab, (int(noise.sum()),), generator=g)
        yield t[:, :-1].to(device), t[:, 1:].to(device)


# loss(logits (batch, context, vocab), targets (batch, context)) -> the mean loss
LOSSES = {
    "torch": lambda logits, targets: F.nll_loss(torch.log_softmax(logits, -1).flatten(0, 1), targets.flatten()),
    "softlight": lambda logits, targets: F.nll_loss(slt.log_softmax(logits, -1).flatten(0, 1), targets.flatten()),
    "softlight-fused": lambda logits, targets: slt.cross_entropy(logits.flatten(0, 1), targets.flatten()),
}


def make_step(loss, *, vocab, d, layers, heads, context, seed, device, backend, lr):
    """One AdamW step of a fresh model (seeded) on (tokens, targets), the loss (a LOSSES value)
    compiled with fullgraph=True; it returns the loss."""
    torch.manual_seed(seed)
    model = LM(vocab, d, layers, heads, context).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def loss_fn(tokens, targets):
        return loss(model(tokens), targets)

    loss_fn = torch.compile(loss_fn, fullgraph=True, backend=backend)

    def step(tokens, targets):
        loss = loss_fn(tokens, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def train(losses, *, vocab=32000, d=128, layers=2, heads=4, context=64, batch=16, steps=300, seed=0,
          device="cpu", backend="inductor", lr=3e-3):
    """{name: (losses, step times in s)} of `steps` AdamW steps of a fresh model for each loss in
    `losses` ({name: a LOSSES value}), compiled with fullgraph=True. The runs take turns step by step,
    on the same batches, so that their step times are measured in the same stretch of time."""
    steps_of = {name: make_step(loss, vocab=vocab, d=d, layers=layers, heads=heads, context=context, seed=seed,
                                device=device, backend=backend, lr=lr) for name, loss in losses.items()}
    runs = {name: ([], []) for name in losses}
    for tokens, targets in batches(vocab, batch, context, steps, seed, device):
        for name, step in steps_of.items():
            if device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            value = step(tokens, targets)
            if device != "cpu":
                torch.cuda.synchronize()
            runs[name][1].append(time.perf_counter() - t0)
            runs[name][0].append(float(value.detach()))
    return runs


def log_softmax_time(loss, *, steps=20, vocab=32000, d=128, layers=2, heads=4, context=64, batch=16,
                     seed=0, device="cpu", backend="inductor", lr=3e-3):
    """(log-softmax time, all time) a step in ms, from torch.profiler over `steps` steps after three
    unprofiled ones: the self time of the kernels (on the CPU, the operators) whose name holds
    "log_softmax" (torch's, fused by inductor with what surrounds them: the NLL, the gradient's
    pieces) or "softlight" (softlight's, the fused loss's whole pass included), and of all of them. On
    the GPU the kernels' device time (the operators that launch them are left out, which would count
    it twice), on the CPU the operators' CPU time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    step = make_step(loss, vocab=vocab, d=d, layers=layers, heads=heads, context=context, seed=seed,
                     device=device, backend=backend, lr=lr)
    data = list(batches(vocab, batch, context, steps + 3, seed, device))
    for tokens, targets in data[:3]:
        step(tokens, targets)
    gpu = device != "cpu"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        for tokens, targets in data[3:]:
            step(tokens, targets)
        if gpu:
            torch.cuda.synchronize()
    ls = total = 0.0
    for e in prof.key_averages():
        if gpu and e.device_type == DeviceType.CPU:
            continue  # (an operator's device time is its kernels', which are events of their own)
        us = e.self_device_time_total if gpu else e.self_cpu_time_total
        total += us
        if "log_softmax" in e.key or "softlight" in e.key:
            ls += us
    return ls / steps / 1e3, total / steps / 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backend", default="inductor", help="torch.compile's backend (aot_eager compiles faster)")
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="then profile this many steps of each and print their log-softmax time")
    args = ap.parse_args(argv)
    kw = dict(vocab=args.vocab, device=args.device, backend=args.backend)
    runs = train(LOSSES, steps=args.steps, **kw)
    ref = runs["torch"][0]
    worst = {name: max(abs(a - b) / abs(a) for a, b in zip(ref, runs[name][0])) for name in runs if name != "torch"}
    print(f"{'step':>5s}" + "".join(f" {name + ' loss':>21s}" for name in runs) +
          "".join(f" {name + ' ms':>19s}" for name in runs))
    for i in range(0, len(ref), max(1, len(ref) // 20)):
        print(f"{i:5d}" + "".join(f" {r[0][i]:21.5f}" for r in runs.values()) +
              "".join(f" {1e3 * r[1][i]:19.2f}" for r in runs.values()))
    half = len(ref) // 2  # the first steps include compilation
    print("median step, second half: " + ", ".join(
        f"{name} {1e3 * sorted(t[half:])[len(t[half:]) // 2]:.2f} ms" for name, (_, t) in runs.items()))
    print("largest relative difference of the losses from torch's: " +
          ", ".join(f"{name} {w:.2e}" for name, w in worst.items()))
    if args.profile:
        shares = {}
        for name, loss in LOSSES.items():
            torch._dynamo.reset()
            shares[name] = log_softmax_time(loss, steps=args.profile, **kw)
            ls, total = shares[name]
            print(f"{name}: log-softmax {ls:.3f} ms a step of {total:.3f} ms profiled ({100 * ls / total:.1f} %)")
        print("torch's log-softmax time / softlight's: " +
              ", ".join(f"{name} {shares['torch'][0] / shares[name][0]:.2f}" for name in shares if name != "torch"))
    return 0 if max(worst.values()) <= 1e-3 else 1


if __name__ == "__main__":
    raise SystemExit(main())

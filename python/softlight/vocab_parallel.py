"""softlight's consumers of the log-sum-exp over a vocabulary split across ranks (tensor-parallel LM
heads), with torch.distributed: NCCL between GPUs, gloo between CPU processes.

    import softlight.vocab_parallel as vp
    loss = vp.cross_entropy(logits_shard, target, group=tp_group)   # target: global token ids

Each rank holds the logits of a contiguous range of the vocabulary, (..., V / ranks), the same rows
on every rank. Each reads its shard once for the per-row statistics (max, sum of exponentials, its
moment, the sum of logits and the chosen tokens' logits: softlight.row_stats with shard=True), one
all-gather of those few values per row merges them, and every rank then holds the statistics of the
whole row. The losses are computed from them identically on every rank; their gradient reads the
shard once more and writes its gradient (softlight.row_stats_backward). The results equal the
single-device functions on the concatenated logits, to rounding.

vocab_start: the first token id of this rank's shard; by default rank * shard width, which needs
every shard to be as wide (it is checked). log_softmax over the split vocabulary writes the shard's
output, which costs one more read of the shard than the statistics alone.
"""
import torch
import torch.distributed as dist

from . import torch as _slt  # noqa: F401 (registers torch.ops.softlight)
from ._errors import InvalidArgumentError

_NINF = float("-inf")
# One collective: each rank's (rows, F) block after the one before (torch 2.11 names it
# all_gather_single, earlier versions all_gather_into_tensor).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _merge(x, index, group, vocab_start, temperature):
    """The shard's statistics, gathered from every rank and merged: (lse, entropy, picked, sum, vocab)."""
    rows = x.shape[0]
    out = torch.ops.softlight.row_stats(x, index, temperature, vocab_start, True)
    _, _, _, picked, zsum, m, se, mom = out
    acc = m.dtype
    width = torch.full((rows, 1), float(x.shape[1]), dtype=acc, device=x.device)
    pack = torch.cat([m[:, None], se[:, None], mom[:, None], zsum[:, None], width, picked.reshape(rows, -1)], 1)
    world = dist.get_world_size(group)
    gathered = torch.empty((world * rows, pack.shape[1]), dtype=acc, device=x.device)
    _all_gather(gathered, pack.contiguous(), group=group)
    gathered = gathered.view(world, rows, pack.shape[1])
    ms, ss, ts = gathered[:, :, 0], gathered[:, :, 1], gathered[:, :, 2]
    big = ms.max(0).values
    delta = ms - big
    empty = ms == _NINF  # a shard whose row is all -inf adds nothing (numerics.cuh's merge)
    w = torch.where(empty, torch.zeros_like(ms), torch.exp(delta))
    s = (w * ss).sum(0)
    t = torch.where(empty, torch.zeros_like(ms), w * (ts + ss * delta)).sum(0)
    log_s = torch.log(s)
    lse = big + log_s
    ent = log_s - t / s
    widths = gathered[:, 0, 4] if rows else torch.full((world,), float(x.shape[1]), dtype=acc)
    return lse, ent, gathered[:, :, 5:].sum(0).reshape(picked.shape), gathered[:, :, 3].sum(0), widths


class _Stats(torch.autograd.Function):
    """Global (lse, entropy, picked, sum) of a shard's rows; the backward writes the shard's gradient.
    The upstream gradients must be the same on every rank (losses computed from these alone)."""

    @staticmethod
    def forward(ctx, x, index, group, vocab_start, temperature):
        lse, ent, picked, zsum, widths = _merge(x, index, group, vocab_start, temperature)
        ctx.save_for_backward(x, index, lse, ent)
        ctx.args = (temperature, vocab_start)
        ctx.mark_non_differentiable(widths)
        ctx.set_materialize_grads(False)
        return lse, ent, picked, zsum, widths

    @staticmethod
    def backward(ctx, d_lse, d_entropy, d_picked, d_sum, _):
        x, index, lse, ent = ctx.saved_tensors
        temperature, vocab_start = ctx.args
        dx = torch.ops.softlight.row_stats_backward(x, lse, ent, index if d_picked is not None else None, d_lse,
                                                    d_entropy, None, d_picked, d_sum, temperature, vocab_start, True)
        return dx, None, None, None, None


def _setup(logits, index, group, vocab_start):
    if logits.dim() == 0:
        raise InvalidArgumentError("softlight: logits must have at least one axis")
    lead = tuple(logits.shape[:-1])
    x = logits.reshape(-1, logits.shape[-1])
    idx = None
    if index is not None:
        if tuple(index.shape) == lead:
            idx = index.reshape(-1)
        elif tuple(index.shape[:-1]) == lead:
            idx = index.reshape(-1, index.shape[-1])
        else:
            raise InvalidArgumentError(f"softlight: index has shape {tuple(index.shape)}; the logits' leading shape "
                                       f"is {lead}")
        idx = idx.to(torch.int64)
    equal = vocab_start is None
    if equal:
        vocab_start = dist.get_rank(group) * x.shape[1]
    return x, idx, lead, int(vocab_start), equal


# (group, device, shard width) whose ranks' shards were found equally wide: later calls take the
# vocabulary as width x ranks, without reading the gathered widths back (on a GPU that copy waits for
# the GPU, and no CUDA graph can hold it).
_EQUAL_WIDTHS = set()


def _stats(logits, index, group, vocab_start, temperature, ignore=None):
    x, idx, lead, start, equal = _setup(logits, index, group, vocab_start)
    lse, ent, picked, zsum, widths = _Stats.apply(x, idx, group, start, float(temperature))
    key = (group, x.device, x.shape[1])
    if equal and key in _EQUAL_WIDTHS:
        vocab = x.shape[1] * dist.get_world_size(group)
    else:
        if equal and bool((widths != widths[0]).any()):
            raise InvalidArgumentError(f"softlight: the shards have widths {widths.long().tolist()}; pass "
                                       f"vocab_start where they differ")
        vocab = int(widths.sum())
        if equal:
            _EQUAL_WIDTHS.add(key)
    if idx is not None and idx.numel():
        bad = (idx < 0) | (idx >= vocab)
        if ignore is not None:
            bad &= idx != ignore
        if x.is_cuda:
            # As the single-device functions on a GPU, the ids are not read back: a token outside the
            # vocabulary picks NaN.
            picked = picked.masked_fill(bad, float("nan"))
        elif bool(bad.any()):
            raise InvalidArgumentError(f"softlight: an index ({int(idx[bad][0])}) is outside the vocabulary "
                                       f"[0, {vocab})")
    return lse, ent, picked, zsum, vocab, lead


def cross_entropy(logits, target, *, group=None, vocab_start=None, ignore_index=-100, label_smoothing=0.0,
                  reduction="mean", z_loss=0.0, temperature=1.0):
    """softlight.torch.cross_entropy over a split vocabulary: (N, V / ranks) logits (or (..., V / ranks)),
    global target ids (...). Every rank returns the same loss."""
    if reduction not in ("none", "sum", "mean"):
        raise InvalidArgumentError(f"softlight: reduction must be none, sum or mean, got {reduction!r}")
    lse, _, picked, zsum, vocab, lead = _stats(logits, target, group, vocab_start, temperature, ignore_index)
    eps = float(label_smoothing)
    loss = (1.0 - eps) * (lse - picked)
    if eps:
        loss = loss + eps * (lse - zsum / vocab)
    if z_loss:
        loss = loss + float(z_loss) * lse * lse
    keep = target.reshape(-1) != ignore_index
    loss = torch.where(keep, loss, torch.zeros_like(loss))
    if reduction == "none":
        return loss.reshape(lead)
    total = loss.sum()
    return total if reduction == "sum" else total / keep.sum()


def token_logprobs(logits, index, *, group=None, vocab_start=None, temperature=1.0):
    """log_softmax over the whole vocabulary at global token ids `index` ((...) or (..., K))."""
    lse, _, picked, _, _, lead = _stats(logits, index, group, vocab_start, temperature)
    out = picked - (lse[:, None] if picked.dim() == 2 else lse)
    return out.reshape(index.shape)


def entropy(logits, *, group=None, vocab_start=None, temperature=1.0):
    """The entropy of softmax over the whole vocabulary, for each row."""
    _, ent, _, _, _, lead = _stats(logits, None, group, vocab_start, temperature)
    return ent.reshape(lead)


def logsumexp(logits, *, group=None, vocab_start=None, temperature=1.0):
    """The log-sum-exp over the whole vocabulary of logits / temperature, for each row."""
    lse, _, _, _, _, lead = _stats(logits, None, group, vocab_start, temperature)
    return lse.reshape(lead)


class _LogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, temperature):
        with torch.no_grad():
            lse = _merge(x, None, group, 0, temperature)[0]
            acc = lse.dtype
            y = (x.to(acc) / temperature - lse[:, None]).to(x.dtype)
        ctx.save_for_backward(y)
        ctx.args = (group, temperature)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        group, temperature = ctx.args
        acc = torch.float64 if y.dtype == torch.float64 else torch.float32
        total = dy.to(acc).sum(-1)
        dist.all_reduce(total, group=group)  # the row's sum of dy over every shard
        dx = (dy.to(acc) - torch.exp(y.to(acc)) * total[:, None]) / temperature
        return dx.to(y.dtype), None, None


def log_softmax(logits, *, group=None, temperature=1.0):
    """This rank's shard of log_softmax over the whole (split) last axis."""
    x, _, lead, _, _ = _setup(logits, None, group, None)
    return _LogSoftmax.apply(x, group, float(temperature)).reshape(logits.shape)


__all__ = ["cross_entropy", "token_logprobs", "entropy", "logsumexp", "log_softmax"]

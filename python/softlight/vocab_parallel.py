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
every shard to be as wide. Every call first checks that the ranks go together (as many rows, the
same dtype, shards that tile the vocabulary) and raises the same error on every rank where they do
not; on a GPU that check reads a few values back (it waits for the GPU), and check=False skips it
where the caller guarantees the layout (CUDA graphs, no host synchronization). log_softmax over the
split vocabulary writes the shard's output, which costs one more read of the shard than the
statistics alone.
"""
import math

import torch
import torch.distributed as dist

from . import _api, _consumers, _linear
from . import torch as _slt  # noqa: F401 (registers torch.ops.softlight)
from ._errors import ArgumentTypeError, InvalidArgumentError
from ._shards import combine, merge

_NINF = float("-inf")
# One collective: each rank's (rows, F) block after the one before (torch 2.11 names it
# all_gather_single, earlier versions all_gather_into_tensor).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _gather_rows(columns, group):
    """Every rank's (rows, F) block of per-row values (columns (rows, k) side by side), as (world, rows,
    F): one all-gather."""
    pack = torch.cat(columns, 1).contiguous()
    world = dist.get_world_size(group)
    gathered = torch.empty((world * pack.shape[0], pack.shape[1]), dtype=pack.dtype, device=pack.device)
    _all_gather(gathered, pack, group=group)
    return gathered.view(world, pack.shape[0], pack.shape[1])


def _merge(x, index, group, vocab_start, temperature):
    """The shard's statistics, gathered from every rank and merged: (lse, entropy, picked, sum, vocab)."""
    rows = x.shape[0]
    out = torch.ops.softlight.row_stats(x, index, temperature, vocab_start, True)
    _, _, _, picked, zsum, m, se, mom = out
    acc = m.dtype
    width = torch.full((rows, 1), float(x.shape[1]), dtype=acc, device=x.device)
    gathered = _gather_rows([m[:, None], se[:, None], mom[:, None], zsum[:, None], width, picked.reshape(rows, -1)],
                            group)
    world = gathered.shape[0]
    lse, ent = merge(gathered[:, :, 0], gathered[:, :, 1], gathered[:, :, 2])
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
    if not isinstance(logits, torch.Tensor):
        raise ArgumentTypeError(f"softlight: logits must be a torch tensor, got {type(logits).__qualname__}")
    if logits.dim() == 0:
        raise InvalidArgumentError("softlight: logits must have at least one axis")
    lead = tuple(logits.shape[:-1])
    x = logits.reshape(math.prod(lead), logits.shape[-1])
    idx = None
    if index is not None:  # (a tensor: the public functions take lists and ints through _index_tensor)
        if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
            raise ArgumentTypeError(f"softlight: token ids must be integers, got {index.dtype}")
        if tuple(index.shape) == lead:
            idx = index.reshape(-1)
        elif tuple(index.shape[:-1]) == lead:
            idx = index.reshape(x.shape[0], index.shape[-1])
        else:
            raise InvalidArgumentError(f"softlight: index has shape {tuple(index.shape)}; the logits' leading shape "
                                       f"is {lead}")
        idx = idx.to(torch.int64)
    if vocab_start is not None:
        if isinstance(vocab_start, bool) or not hasattr(vocab_start, "__index__"):
            raise ArgumentTypeError(f"softlight: vocab_start must be an int, got {type(vocab_start).__qualname__}")
        vocab_start = vocab_start.__index__()
    return x, idx, lead, vocab_start


_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}
_FIELDS = ("rows", "shard width", "vocab_start", "dtype", "device type", "tokens a row")


def _agree(x, idx, group, vocab_start):
    """Checks, on every call, that the ranks' shards go together: as many rows, the same dtype, kind
    of device and number of tokens a row, and shards that tile [0, V) (with vocab_start None, each rank
    r starts at r x its width, which needs equal widths). Every rank gathers the same description of
    every rank, so that all of them raise the same error, before any collective that a mismatch
    would break. Returns (V, this rank's vocab_start). On a GPU its result is read on the host (one
    small copy that waits for the GPU): check=False skips it (docs/consumers.md)."""
    world = dist.get_world_size(group)
    rows, width = x.shape
    k = -1 if idx is None else (0 if idx.dim() == 1 else idx.shape[1])
    me = [rows, width, -1 if vocab_start is None else vocab_start, _DTYPES.get(x.dtype, -1),
          int(x.is_cuda), k]
    mine = torch.tensor(me, dtype=torch.int64, device=x.device)
    every = torch.empty(world * len(me), dtype=torch.int64, device=x.device)
    _all_gather(every, mine, group=group)
    table = every.view(world, len(me)).tolist()
    for i, field in enumerate(_FIELDS):
        if i in (1, 2):
            continue
        values = [r[i] for r in table]
        if len(set(values)) > 1:
            raise InvalidArgumentError(f"softlight: the ranks' {field} differ ({values}); every rank must hold the "
                                       f"same rows of its shard")
    widths = [r[1] for r in table]
    starts = [r[2] for r in table]
    if all(s == -1 for s in starts):
        if len(set(widths)) > 1:
            raise InvalidArgumentError(f"softlight: the shards have widths {widths}; pass vocab_start where they "
                                       f"differ")
        starts = [r * widths[0] for r in range(world)]
    elif any(s == -1 for s in starts):
        raise InvalidArgumentError(f"softlight: vocab_start is given on some ranks and not on others ({starts})")
    end = 0
    for s, w in sorted(zip(starts, widths)):
        if s != end:
            raise InvalidArgumentError(f"softlight: the shards (vocab_start {starts}, widths {widths}) do not tile "
                                       f"the vocabulary: " + ("they overlap" if s < end else "a gap") +
                                       f" at token {min(s, end)}")
        end = s + w
    return end, starts[dist.get_rank(group)]


def _stats(logits, index, group, vocab_start, temperature, ignore=None, check=True):
    x, idx, lead, start = _setup(logits, index, group, vocab_start)
    temperature = _api._check_temperature(temperature)
    world = dist.get_world_size(group)
    if check:
        vocab, start = _agree(x, idx, group, start)
    elif start is None:
        start, vocab = dist.get_rank(group) * x.shape[1], x.shape[1] * world
    else:
        vocab = None  # from the gathered widths below
    lse, ent, picked, zsum, widths = _Stats.apply(x, idx, group, start, temperature)
    if vocab is None:
        vocab = int(widths.sum())
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
                  reduction="mean", z_loss=0.0, temperature=1.0, check=True):
    """softlight.torch.cross_entropy over a split vocabulary: (N, V / ranks) logits (or (..., V / ranks)),
    global target ids (...). Every rank returns the same loss. check: the ranks' agreement (_agree),
    on every call unless False."""
    _, ignore_index, eps, z_loss = _consumers.ce_options(reduction, ignore_index, label_smoothing, z_loss)
    if isinstance(target, torch.Tensor) and target.is_floating_point():
        raise InvalidArgumentError("softlight: cross_entropy takes class indices as targets, not probabilities")
    target = _slt._index_tensor(target, logits, "target")
    lse, _, picked, zsum, vocab, lead = _stats(logits, target, group, vocab_start, temperature, ignore_index, check)
    loss = (1.0 - eps) * (lse - picked)
    if eps:
        loss = loss + eps * (lse - zsum / vocab)
    if z_loss:
        loss = loss + float(z_loss) * lse * lse
    keep = target.reshape(-1) != ignore_index
    loss = torch.where(keep, loss, torch.zeros_like(loss))
    if reduction == "none":
        loss = loss.reshape(lead)
    else:
        loss = loss.sum() if reduction == "sum" else loss.sum() / keep.sum()
    if logits.dtype in (torch.float16, torch.bfloat16) and not _slt._any_autocast():
        loss = loss.to(logits.dtype)  # as softlight.torch.cross_entropy (and torch) return it
    return loss


def token_logprobs(logits, index, *, group=None, vocab_start=None, temperature=1.0, check=True):
    """log_softmax over the whole vocabulary at global token ids `index` ((...) or (..., K))."""
    index = _slt._index_tensor(index, logits, "index")
    lse, _, picked, _, _, lead = _stats(logits, index, group, vocab_start, temperature, None, check)
    out = picked - (lse[:, None] if picked.dim() == 2 else lse)
    return out.reshape(index.shape)


def entropy(logits, *, group=None, vocab_start=None, temperature=1.0, check=True):
    """The entropy of softmax over the whole vocabulary, for each row."""
    _, ent, _, _, _, lead = _stats(logits, None, group, vocab_start, temperature, None, check)
    return ent.reshape(lead)


def logsumexp(logits, *, group=None, vocab_start=None, temperature=1.0, check=True):
    """The log-sum-exp over the whole vocabulary of logits / temperature, for each row."""
    lse, _, _, _, _, lead = _stats(logits, None, group, vocab_start, temperature, None, check)
    return lse.reshape(lead)


class _LogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, temperature):
        # As the single-device kernels: differences from the row's max before the scale, so that no
        # common offset of the logits and no small temperature costs precision or overflows:
        # y = (x - m) / T - log(sum over every shard of exp((x - m) / T)), m the whole row's max.
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        with torch.no_grad():
            xa = x.to(acc)
            m = xa.amax(-1) if x.shape[-1] else torch.full(x.shape[:-1], _NINF, dtype=acc, device=x.device)
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)[:, None]  # (a row of -inf or +inf: no shift)
            d = (xa - m) / temperature
            s = torch.exp(d).sum(-1)
            dist.all_reduce(s, group=group)
            y = (d - torch.log(s)[:, None]).to(x.dtype)
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
    x, _, lead, _ = _setup(logits, None, group, None)
    return _LogSoftmax.apply(x, group, _api._check_temperature(temperature)).reshape(logits.shape)


class _Ranks:
    """This rank's part of a vocabulary split over a process group, as the LM head's functions see it
    (softlight/_linear.py): its first word, the whole vocabulary's size, the merge of every rank's
    statistics (one all-gather of a few values a token) and the sum of the ranks' hidden gradients."""

    def __init__(self, group, start, vocab):
        self.group, self.start, self.vocab = group, start, vocab

    def merge(self, m, se, mom, picked, zsum):
        cols = [m[:, None], se[:, None], mom[:, None], (zsum if zsum is not None else torch.zeros_like(m))[:, None]]
        g = _gather_rows(cols + ([picked.reshape(m.shape[0], -1)] if picked is not None else []), self.group)
        m, se, mom = combine(g[:, :, 0], g[:, :, 1], g[:, :, 2])
        return (m, se, mom, None if picked is None else g[:, :, 4:].sum(0).reshape(picked.shape),
                None if zsum is None else g[:, :, 3].sum(0))

    def all_reduce(self, t):
        dist.all_reduce(t, group=self.group)


def _head_shard(hidden, weight, group, vocab_start, check):
    """_Ranks of an LM head's weight shard: with check, the ranks' agreement (as _agree: as many tokens,
    one dtype and kind of device, shards that tile the vocabulary); without, equal shard widths."""
    if not isinstance(hidden, torch.Tensor) or not isinstance(weight, torch.Tensor) or weight.dim() != 2 or \
            hidden.dim() < 1:
        raise InvalidArgumentError("softlight: hidden (..., D) and a weight shard (V / ranks, D) expected")
    if vocab_start is not None:
        if isinstance(vocab_start, bool) or not hasattr(vocab_start, "__index__"):
            raise ArgumentTypeError(f"softlight: vocab_start must be an int, got {type(vocab_start).__qualname__}")
        vocab_start = vocab_start.__index__()
    rows = math.prod(hidden.shape[:-1])
    if check:  # (a stand-in of the shard's logits' shape, holding no memory)
        like = torch.empty((), dtype=weight.dtype, device=weight.device).expand(rows, weight.shape[0])
        vocab, start = _agree(like, None, group, vocab_start)
    else:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        start = rank * weight.shape[0] if vocab_start is None else vocab_start
        vocab = weight.shape[0] * world
    return _Ranks(group, start, vocab)


def linear_cross_entropy(hidden, weight, target, *, group=None, vocab_start=None, bias=None, ignore_index=-100,
                         label_smoothing=0.0, z_loss=0.0, softcap=None, temperature=1.0, reduction="mean", shift=False,
                         return_lse=False, check=True):
    """softlight.torch.linear_cross_entropy with the weight (and bias) of this rank's shard of the
    vocabulary, (V / ranks, D) (Megatron's vocabulary-parallel LM head): hidden (..., D) and global
    target ids (...) the same on every rank. Every rank returns the same loss, equal to one process's
    over the whole weight; the hidden's gradient is the whole one on every rank (summed over the ranks
    here: an all-reduce), the weight's and the bias's are the shard's. In vocabulary chunks, as the
    low-memory form: 64 MiB of logits and 4 N D bytes beyond the gradients. check: the ranks'
    agreement, on every call unless False (then the shards must be equally wide)."""
    shard = _head_shard(hidden, weight, group, vocab_start, check)
    return _linear.linear_cross_entropy(hidden, weight, target, bias=bias, ignore_index=ignore_index,
                                        label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap,
                                        temperature=temperature, reduction=reduction, shift=shift,
                                        return_lse=return_lse, memory="low_memory", _shard=shard)


def linear_row_stats(hidden, weight, index, *, group=None, vocab_start=None, bias=None, temperature=1.0, softcap=None,
                     shift=False, check=True):
    """softlight.torch.linear_row_stats ({"logprobs", "entropy"} over the whole vocabulary) with the
    weight (and bias) of this rank's shard, as linear_cross_entropy takes them."""
    shard = _head_shard(hidden, weight, group, vocab_start, check)
    return _linear.linear_row_stats(hidden, weight, index, bias=bias, temperature=temperature, softcap=softcap,
                                    shift=shift, memory="low_memory", _shard=shard)


def linear_token_logprobs(hidden, weight, index, **kw):
    """linear_row_stats' logprobs: each token's log-prob at its global id over the whole vocabulary."""
    return linear_row_stats(hidden, weight, index, **kw)["logprobs"]


__all__ = ["cross_entropy", "token_logprobs", "entropy", "logsumexp", "log_softmax", "linear_cross_entropy",
           "linear_row_stats", "linear_token_logprobs"]

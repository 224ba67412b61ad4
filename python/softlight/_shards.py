"""Statistics of the vocabulary's pieces merged into the whole's: the vocabulary-parallel functions
merge their ranks' shards with it, the LM head's low-memory form its vocabulary chunks."""
import torch

_NINF = float("-inf")


def merge(m, se, mom):
    """(lse, entropy) of rows from their pieces' (max, sumexp, moment) stacked on dim 0 (row_stats'
    statistics of z = logits / temperature). A piece whose row is all -inf adds nothing (as
    numerics.cuh's merge: exp(-inf - -inf) would be NaN)."""
    big = m.max(0).values
    delta = m - big
    empty = m == _NINF
    w = torch.where(empty, torch.zeros_like(m), torch.exp(delta))
    s = (w * se).sum(0)
    t = torch.where(empty, torch.zeros_like(m), w * (mom + se * delta)).sum(0)
    log_s = torch.log(s)
    return big + log_s, log_s - t / s

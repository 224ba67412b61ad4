"""Statistics of the vocabulary's pieces merged into the whole's: the vocabulary-parallel functions
merge their ranks' shards with it, the LM head's vocabulary chunks (and ranks) likewise."""
import torch

_NINF = float("-inf")


def combine(m, se, mom):
    """One piece's (max, sumexp, moment) from pieces' stacked on dim 0 (row_stats' statistics of
    z = logits / temperature). A piece whose row is all -inf adds nothing (as numerics.cuh's merge:
    exp(-inf - -inf) would be NaN)."""
    big = m.max(0).values
    delta = m - big
    empty = m == _NINF
    w = torch.where(empty, torch.zeros_like(m), torch.exp(delta))
    s = (w * se).sum(0)
    t = torch.where(empty, torch.zeros_like(m), w * (mom + se * delta)).sum(0)
    return big, s, t


def finish(m, se, mom):
    """(lse, entropy) of rows from their (max, sumexp, moment)."""
    log_s = torch.log(se)
    return m + log_s, log_s - mom / se


def merge(m, se, mom):
    """(lse, entropy) of rows from their pieces' (max, sumexp, moment) stacked on dim 0."""
    return finish(*combine(m, se, mom))

"""`python -m softlight bench`: softlight against a copy of the same bytes and the public anchors,
side by side in one run, every result checked against float64 first (python -m softlight bench
--help). One module an op: forward (the GPU's log-softmax, forward and backward, and the host cost
of a call), consumers (cross-entropy, token log-probs, entropy, logsumexp), cpu (the CPU backend),
vocab_parallel (over ranks); common holds what they share, cli the command line."""
from .cli import main

__all__ = ["main"]

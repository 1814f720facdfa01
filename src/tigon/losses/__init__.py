"""Post-training losses on per-token log-probabilities: the cheap per-token formulas, in plain PyTorch, that autograd
differentiates; the heavy LM-head part (log-probabilities without the (tokens, vocab) logits) is
:func:`tigon.functional.fused_linear_logprobs`. The fused ops and modules built on them are in :mod:`tigon.ops` and
:mod:`tigon.nn`.
"""

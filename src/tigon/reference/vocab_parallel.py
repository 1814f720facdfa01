"""Vocabulary-parallel cross-entropy in PyTorch: the two local steps of :mod:`tigon.kernels.vocab_parallel` (the
partials of one shard, and the gradient on it from the global statistics), run when the kernels are not.

The specification of the whole op is the plain cross-entropy (:mod:`tigon.reference.cross_entropy`) of the logits
the shards make up: ``cross_entropy(torch.cat(shards, dim=1), target, ...)``; the tests compare with exactly that.
"""

from __future__ import annotations

import torch


def _transform(x: torch.Tensor, logit_scale: float, softcap: float | None) -> torch.Tensor:
    x = x.float() * logit_scale if logit_scale != 1.0 else x.float()
    return softcap * torch.tanh(x / softcap) if softcap is not None else x


def local_stats(x, target, vocab_start: int, ignore_index: int, logit_scale: float, softcap: float | None,
                smoothing: bool) -> torch.Tensor:
    """:func:`tigon.kernels.vocab_parallel.local_stats` in PyTorch: (n, 5) fp32 (m, s, x_t, own, sx)."""
    xs = _transform(x, logit_scale, softcap)
    vl = x.shape[1]
    valid = target != ignore_index
    t_loc = target - vocab_start
    own = valid & (t_loc >= 0) & (t_loc < vl)
    m = xs.amax(1)
    s = torch.exp(xs - m[:, None]).sum(1)
    xt = xs.gather(1, torch.where(own, t_loc, 0).long()[:, None]).squeeze(1)
    sx = xs.sum(1) if smoothing else torch.zeros_like(m)
    zero = torch.zeros_like(m)
    return torch.stack([torch.where(valid, m, zero), torch.where(valid, s, zero), torch.where(own, xt, zero),
                        own.float(), torch.where(valid, sx, zero)], 1)


def shard_grad(x, t_local, gstats, coef, *, ignore_index: int, label_smoothing: float, lse_square_scale: float,
               logit_scale: float, softcap: float | None, n_classes: int) -> torch.Tensor:
    """``coef * d loss / d x`` on the shard ``x`` (n, Vl), in x's dtype: the global (max, log-sum) ``gstats`` (n, 2),
    local targets ``t_local`` (outside [0, Vl) where another shard owns the target), ``coef`` 0-d or (n,)."""
    xs = _transform(x, logit_scale, softcap)
    lse = gstats[:, 0] + gstats[:, 1]
    valid = t_local != ignore_index
    a = torch.where(valid, coef.float().expand(x.shape[0]), torch.zeros_like(lse))
    eps = label_smoothing
    p = torch.exp((xs - gstats[:, :1]) - gstats[:, 1:])
    g = (a * (1.0 + 2.0 * lse_square_scale * lse))[:, None] * p - a[:, None] * eps / n_classes
    own = valid & (t_local >= 0) & (t_local < x.shape[1])
    g[own, t_local[own].long()] -= a[own] * (1.0 - eps)
    if softcap is not None:
        g = g * (1.0 - (xs / softcap) ** 2)
    return (g * logit_scale).to(x.dtype)

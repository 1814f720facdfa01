"""Attention with sinks (GPT-OSS) on PyTorch's ``scaled_dot_product_attention``, and its patch.

**The op.** GPT-OSS gives each query head h a learned logit ``sinks[h]`` (``GptOssAttention.sinks``, passed to the
attention function as ``s_aux``) that joins every query's softmax denominator but carries no value
(transformers ``modeling_gpt_oss.py``, ``eager_attention_forward``; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model
Card")::

    p = softmax([s_i1 .. s_iT, sink_h]);  out_i = sum_j p_j v_j        (the sink's probability is dropped)

transformers runs its eager attention for it (SDPA has no sink argument), materialising (B, H, T, T) scores.
:func:`sink_attention` computes the same thing with SDPA by folding the sink into one extra key, using the identity

    softmax over [s, sink] restricted to s  ==  softmax over the keys [sink key, k_1 .. k_T] with v_sink = 0,

when the extra key's logit is ``sink_h`` for every query of head h. The head dim is widened by one column: the
queries get ``sink_h / scale`` there, the sink key a 1 and the real keys a 0, so that ``q'_i . k'_sink * scale =
sink_h`` and ``q'_i . k'_j * scale = q_i . k_j * scale``; q', k' (and v, for backends that need equal head dims) are
zero-padded to a multiple of 8. The sink sits in the *queries* (per query head), so k / v keep their own heads
(grouped-query attention needs no per-head key). The sink key is key 0, seen by every query; gradients reach q, k, v
and ``sinks`` through SDPA's own backward and the concatenations.

Masks: transformers' sdpa mask builder (``masking_utils.sdpa_mask``, registered under :data:`NAME`) hands over None
(causal, no padding, no sliding window reached) or a boolean (B, 1, Tq, Tk) mask (True: attend); a float additive
mask is accepted too. A given mask gets a leading "visible" column for the sink key. Without one, a causal call with
Tq == Tk prepends a zero query row, so that the widened problem is square and ``is_causal=True`` (upper-left
aligned) is exactly "sink + keys 0..i" for query i: no mask is materialised and flash attention stays eligible.

**The patch.** :func:`plan` (called by :func:`tigon.patch` for families that declare attention classes with sinks,
:attr:`~tigon.integrations.family_spec.FamilySpec.sinks`) switches a model whose config asks for ``"eager"``
attention to :data:`NAME`: registered once in transformers' ``AttentionInterface`` (this module's
:func:`attention_forward`) and ``AttentionMaskInterface`` (transformers' own sdpa mask builder). The switch is the
``_attn_implementation`` of the model's own copy of its config (another model built from the same config object keeps
eager); :func:`restore` (called by :func:`tigon.unpatch`) sets ``"eager"`` back. Other attention implementations (flex,
kernels from the Hub) are left alone, with the reason in the report.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention_switch import switch, switched

NAME = "tigon_sink_sdpa"
"""The attention implementation name registered with transformers (``config._attn_implementation``)."""

_registered = False


def _width(d: int) -> int:
    """Head dim ``d`` plus the sink column, rounded up to a multiple of 8 (what SDPA's fast backends want)."""
    return (d + 1 + 7) // 8 * 8


def _repeat_heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """(B, Hkv, T, D) -> (B, Hkv * n, T, D), each kv head repeated n times in a row (GQA's head order)."""
    if n == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n, t, d).reshape(b, h * n, t, d)


def _window_mask(tq: int, tk: int, window: int | None, device) -> torch.Tensor:
    """Boolean (Tq, Tk) causal mask aligned bottom-right (query i is at position i + Tk - Tq), keys older than
    ``window`` positions hidden (transformers' sliding window: ``q - k < window``)."""
    q = torch.arange(tq, device=device)[:, None] + (tk - tq)
    k = torch.arange(tk, device=device)[None, :]
    keep = k <= q
    if window is not None:
        keep = keep & (q - k < window)
    return keep


def sink_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor, *,
                   scale: float, attention_mask: torch.Tensor | None = None, is_causal: bool = True,
                   sliding_window: int | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    """Softmax attention with one learned sink logit per query head, computed by ``scaled_dot_product_attention``.

    Args:
        query: (B, H, Tq, D). key, value: (B, Hkv, Tk, D) with H a multiple of Hkv (grouped-query attention).
            One floating dtype for all three (bf16 / fp16 / fp32 / fp64).
        sinks: (H,) logits, any floating dtype (cast to the query's; GPT-OSS's ``module.sinks``).
        scale: the softmax scale of the real logits (GPT-OSS: ``head_dim ** -0.5``); the sink logit is not scaled.
        attention_mask: None, or a boolean (True: attend) or additive float mask broadcastable to (B, H, Tq, Tk'),
            Tk' >= Tk (only the first Tk key columns are read), as transformers' sdpa / eager mask builders make.
            Given a mask, ``is_causal`` and ``sliding_window`` are not applied again (the mask holds them).
        is_causal: without a mask, mask keys after each query (bottom-right aligned: query i sits at key position
            i + Tk - Tq, as with a KV cache).
        sliding_window: without a mask, also hide keys ``sliding_window`` or more positions before the query.
        dropout_p: SDPA's dropout on the probabilities (the sink's included, which carries no value): the same
            distribution as transformers' dropout on the real keys' probabilities, not the same random draws.

    Returns:
        (B, H, Tq, D) in the query's dtype: ``sum_j p_ij v_j`` with ``p_i = softmax([s_i, sink_h])`` minus its last
        entry, ``s_ij = q_i . k_j * scale`` (masked entries excluded). A query that sees no key gets 0 (all
        probability on the sink), as transformers' eager attention gives.

    Raises:
        ValueError: shapes that do not fit (ranks, head counts, head dims, ``sinks`` not of length H).
    """
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(f"sink_attention: query, key and value must be 4-D (B, heads, T, D); got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    b, h, tq, d = query.shape
    hkv, tk = key.shape[1], key.shape[2]
    if key.shape != value.shape or key.shape[-1] != d or h % hkv or key.shape[0] != b:
        raise ValueError(f"sink_attention: key and value must be (B, Hkv, Tk, D) with B and D of the query and H a "
                         f"multiple of Hkv; got query {tuple(query.shape)}, key {tuple(key.shape)}, value "
                         f"{tuple(value.shape)}")
    if sinks.shape != (h,):
        raise ValueError(f"sink_attention: sinks must be ({h},), one logit per query head; got {tuple(sinks.shape)}")
    width, dtype = _width(d), query.dtype
    # queries: [q, sink / scale, 0 ...]; keys: [sink key e_d; k_j padded]; values: [0; v_j] padded to the same width
    col = (sinks.to(dtype) / scale).view(1, h, 1, 1).expand(b, h, tq, 1)
    q = torch.cat([query, col, query.new_zeros(b, h, tq, width - d - 1)], dim=-1)
    unit = (torch.arange(width, device=key.device) == d).to(dtype).expand(b, hkv, 1, width)
    k = torch.cat([unit, F.pad(key, (0, width - d))], dim=2)
    v = F.pad(value, (0, width - d, 1, 0))
    if attention_mask is None and is_causal and sliding_window is not None and tk > sliding_window:
        attention_mask = _window_mask(tq, tk, sliding_window, query.device)  # (what transformers' mask would hold)
    if attention_mask is not None:
        mask = attention_mask[..., :tk]
        if mask.dtype == torch.bool:
            mask = F.pad(mask, (1, 0), value=True)
        else:
            mask = F.pad(mask.to(dtype), (1, 0), value=0.0)
        k, v = _repeat_heads(k, h // hkv), _repeat_heads(v, h // hkv)  # a mask keeps SDPA off its GQA path
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    elif is_causal and tq == tk and tq > 1:
        q = F.pad(q, (0, 0, 1, 0))  # a zero query row: square, so upper-left causal == sink + keys 0..i
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale,
                                             enable_gqa=h != hkv)[:, :, 1:]
    else:
        mask = None
        if is_causal and tq > 1:  # a query shorter than the keys (a KV cache): bottom-right aligned
            mask = F.pad(_window_mask(tq, tk, None, query.device), (1, 0), value=True)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                             enable_gqa=h != hkv)
    return out[..., :d]


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, s_aux: torch.Tensor | None = None, is_causal=None,
                      **kwargs):
    """transformers' attention-interface signature (``GptOssAttention.forward`` calls it with ``s_aux=self.sinks``)
    -> ``(output (B, Tq, H, D), None)``: :func:`sink_attention`; a call without ``s_aux`` runs transformers' sdpa
    attention. No attention weights are returned (SDPA has none)."""
    if s_aux is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = sink_attention(query, key, value, s_aux, scale=scale, attention_mask=attention_mask, is_causal=causal,
                         sliding_window=sliding_window, dropout_p=dropout)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register :data:`NAME` with transformers: :func:`attention_forward` and transformers' sdpa mask builder.
    Idempotent; a new name only (no existing implementation changes)."""
    global _registered
    if _registered:
        return
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    _registered = True


# ---- the patch (tigon.patch / tigon.unpatch, instance level) -----------------------------------------------------
CLASS_NOTE = ("attention with sinks runs on SDPA per model only (it switches the model config's attention "
              "implementation)")
DETAIL = (f"eager attention with sinks -> sink_attention: torch SDPA with the sink folded into an extra key "
          f"(config._attn_implementation {NAME!r}, transformers' sdpa masks)")


def _sink_modules(model: torch.nn.Module, specs):
    """(path, module) of every module of ``model`` whose class is one of the specs' :attr:`FamilySpec.sinks`."""
    import importlib
    classes = tuple(c for sp in specs if sp.sinks for c in (getattr(importlib.import_module(sp.module), n, None)
                                                             for n in sp.sinks) if c is not None)
    if not classes:
        return []
    return [(p, m) for p, m in model.named_modules() if isinstance(m, classes)]


def plan(model: torch.nn.Module, specs, report):
    """The actions switching ``model``'s eager sink attention to :data:`NAME` (one report entry per attention
    module; the switch itself is one per config object); skipped / already-patched entries go to ``report``.

    The switch goes on a copy of each config, which every module of ``model`` that held it then holds (the model's
    ``config`` included): models built from one config object (a policy and its reference model) share it, and
    patching one must not switch the other (nor make its report say it was patched)."""
    from .plan import Action
    from .report import PatchEntry

    configs: dict[int, object] = {}
    entries = []
    for path, m in _sink_modules(model, specs):
        cfg = getattr(m, "config", None)
        impl = getattr(cfg, "_attn_implementation", None)
        if impl == NAME:  # (a copy unpickled in another process: the name is registered again here)
            register()
            report.already_patched.append(PatchEntry("sinks", path, "instance level"))
        elif not isinstance(getattr(m, "sinks", None), torch.Tensor):
            report.skipped.append(PatchEntry("sinks", path, f"{type(m).__name__} has no sinks tensor"))
        elif impl not in ("eager", None):
            report.skipped.append(PatchEntry("sinks", path, f"config._attn_implementation is {impl!r}, not eager: "
                                             "that implementation is left alone"))
        elif getattr(cfg, "output_attentions", False):
            report.skipped.append(PatchEntry("sinks", path, "config.output_attentions is set: SDPA returns no "
                                             "attention weights, eager attention kept"))
        else:
            configs[id(cfg)] = cfg
            entries.append(PatchEntry("sinks", path, DETAIL))
    if not entries:
        return []

    def apply():
        register()
        switch(model, configs, NAME)  # the model's own copy: another model built from the same config keeps eager

    return [Action(entries[0], apply)] + [Action(e, lambda: None) for e in entries[1:]]


def restore(model: torch.nn.Module, report) -> None:
    """Undo :func:`plan`: every config of ``model``'s modules set to :data:`NAME` goes back to ``"eager"``."""
    from .report import PatchEntry

    configs, holders = switched(model, NAME)
    for path, m in holders:
        if hasattr(m, "sinks"):
            report.replaced.append(PatchEntry("sinks", path or f"({type(m).__name__})", "eager attention"))
    for cfg in configs.values():
        cfg._attn_implementation = "eager"

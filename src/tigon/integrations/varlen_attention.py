"""Vision towers' packed attention, batched by chunk length on PyTorch's ``scaled_dot_product_attention``, and its
patch.

**Why.** The vision towers of Qwen2-VL, Qwen2.5-VL, Qwen3-VL (and its MoE form) and GLM-4V (and GLM-4V-MoE) run one
packed sequence of patches through each block, attending within chunks given by ``cu_seqlens``: one chunk per image
or video frame, and in Qwen2.5-VL's window blocks one per window of 8 x 8 patches (transformers
``modeling_qwen2_5_vl.py``, ``Qwen2_5_VLVisionAttention.forward``). With a flash-attention implementation transformers
hands ``cu_seqlens`` to the varlen kernel; with ``"sdpa"`` (the default) or ``"eager"`` it splits q / k / v by the
chunk lengths and calls the attention once per chunk. Qwen2.5-VL-7B at 4 x 2048 tokens with 512 image tokens a sample
made 4,052 cuDNN attention forward calls (and as many backward) in one training step on an H100 (session 27): the
step took 626 ms against 413 ms of GPU time, and HF eager's 659 ms against 490.

**The op.** :func:`varlen_attention` takes transformers' varlen call (q, k, v of (1, heads, S, head_dim) and
``cu_seq_lens_q`` (chunks + 1,)) and computes the same attention with one call of the tower's own implementation
(SDPA, or the modeling module's eager attention) per distinct chunk length: the chunks of length L are stacked as a
batch (n, heads, L, head_dim). When every chunk has one length (a tower fed
images whose sides are whole windows), that is a view of q / k / v and of the output, no copy; otherwise each length's
rows are gathered by index (``index_select``) and the outputs put back in order by the inverse permutation (its
backward adds each row once: exact). Each chunk's attention is a function of its own rows only (no mask, not causal),
so the result is that of the per-chunk loop up to the kernels' own rounding, which may depend on the batch size. The
one host sync is the chunk lengths' ``tolist()``, as in transformers' loop (and its ``max_seqlen``).

**The patch.** :func:`plan` (called by :func:`tigon.patch` for families that declare such attention classes,
:attr:`~tigon.integrations.family_spec.FamilySpec.varlen_attention`) switches a vision config whose
``_attn_implementation`` is ``"sdpa"`` or ``"eager"`` to that implementation's name in :data:`NAMES`, registered in
transformers' ``AttentionInterface``. The names contain "flash" because transformers sends the varlen arguments only
to implementations whose name does (``utils.generic.is_flash_attention_requested``); in these towers that test
chooses the branch and, in the vision model, whether ``max_seqlen`` is computed, nothing else. The switch goes on
the model's own copy of the vision config, which the model's (shallow-copied) ``config.vision_config`` then is
(:mod:`tigon.integrations.attention_switch`: the caller's config objects are left as they were, and a later
``model.set_attn_implementation`` reaches the tower); :func:`restore` (``tigon.unpatch``) sets the implementation
back. Flex and flash-attention towers are left alone with the reason in the report.
"""

from __future__ import annotations

import torch

from .attention_switch import switch, switched

NAMES = {"sdpa": "tigon_varlen_flash_sdpa", "eager": "tigon_varlen_flash_eager"}
"""The tower's implementation -> the name registered with transformers (``config._attn_implementation``) for it."""

_registered = False


def _inner(module: torch.nn.Module, implementation: str):
    """transformers' attention function ``implementation`` as ``module`` would call it: SDPA's shared one, or the
    modeling module's own ``eager_attention_forward``."""
    if implementation == "sdpa":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward
    import sys
    return sys.modules[type(module).__module__].eager_attention_forward


def _batch(x: torch.Tensor, pos: torch.Tensor | None, n: int, length: int) -> torch.Tensor:
    """(1, heads, S, head_dim) -> (n, heads, length, head_dim): the rows ``pos`` (n * length of them, chunk by chunk),
    or all S rows in order when ``pos`` is None (a view)."""
    rows = x[0] if pos is None else x[0].index_select(1, pos)
    return rows.unflatten(1, (n, length)).transpose(0, 1)


def varlen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None = None, dropout: float = 0.0, scaling: float | None = None,
                     is_causal: bool | None = None, cu_seq_lens_q: torch.Tensor | None = None,
                     cu_seq_lens_k: torch.Tensor | None = None, max_length_q: int | None = None,
                     max_length_k: int | None = None, *, implementation: str = "sdpa",
                     **kwargs) -> tuple[torch.Tensor, None]:
    """Attention within the chunks of a packed sequence, one attention call per distinct chunk length (module
    docstring).

    transformers' attention-interface signature (``integrations/sdpa_attention.py``), called by a vision tower's
    varlen branch; registered once per ``implementation`` (:data:`NAMES`).

    Args:
        module: the attention module (its ``num_key_value_groups``, ``is_causal`` as transformers' SDPA reads them).
        query, key, value: (1, heads, S, head_dim), any dtype the implementation takes; one S.
        attention_mask: None on the varlen path (a mask, or a call without ``cu_seq_lens_q``, goes to the
            implementation as is).
        dropout, scaling, is_causal: as transformers' attention functions (applied within each chunk).
        cu_seq_lens_q: (chunks + 1,) integer, non-decreasing, from 0 to S; ``cu_seq_lens_k`` must be the same
            tensor (or equal); max_length_q / max_length_k: unused (the lengths are read once).
        implementation: the attention each batch of chunks runs: ``"sdpa"`` (transformers' SDPA function) or
            ``"eager"`` (the modeling module's ``eager_attention_forward``), the tower's own choice.

    Returns:
        ``(out, None)``, out (1, S, heads, head_dim) in query's dtype: each chunk's rows attend to that chunk's rows.

    Raises:
        ValueError: query / key / value not (1, heads, S, head_dim) with one S; ``cu_seq_lens_q`` not 1-D, not from 0
            to S, or decreasing; ``cu_seq_lens_k`` different.
    """
    attend = _inner(module, implementation)
    cu = cu_seq_lens_q
    if cu is None or attention_mask is not None:
        return attend(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                      is_causal=is_causal, **kwargs)
    s = query.shape[2]
    if query.dim() != 4 or query.shape[0] != 1 or key.shape[2] != s or value.shape[2] != s:
        raise ValueError(f"varlen_attention: query / key / value must be (1, heads, S, head_dim) with one S; got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if cu_seq_lens_k is not None and cu_seq_lens_k is not cu and not torch.equal(cu_seq_lens_k, cu):
        raise ValueError("varlen_attention: cu_seq_lens_k must equal cu_seq_lens_q (attention within each chunk)")
    bounds = cu.tolist() if cu.dim() == 1 else None
    if not bounds or bounds[0] != 0 or bounds[-1] != s or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"varlen_attention: cu_seq_lens_q must be 1-D, non-decreasing, from 0 to S = {s}; got shape "
                         f"{tuple(cu.shape)}, values {bounds[:8] if bounds else bounds}")
    lengths = [b - a for a, b in zip(bounds, bounds[1:]) if b > a]
    distinct = sorted(set(lengths))
    heads, dim = query.shape[1], value.shape[3]

    def batched(q, k, v):
        out, _ = attend(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)
        return out.reshape(-1, heads, dim)  # (n, length, heads, dim) -> (n * length, heads, dim)

    if len(distinct) == 1:  # chunks of one length: consecutive blocks of S, views in and out
        n, length = len(lengths), distinct[0]
        return batched(*(_batch(x, None, n, length) for x in (query, key, value))).unsqueeze(0), None
    starts = torch.tensor([a for a, b in zip(bounds, bounds[1:]) if b > a], dtype=torch.long)
    sizes = torch.tensor(lengths, dtype=torch.long)
    outs, rows = [], []
    for length in distinct:  # (the positions are formed on the host from the lengths already read: no sync)
        first = starts[sizes == length]
        pos = (first[:, None] + torch.arange(length)).reshape(-1).to(query.device, non_blocking=True)
        outs.append(batched(*(_batch(x, pos, first.numel(), length) for x in (query, key, value))))
        rows.append(pos)
    rows = torch.cat(rows)
    inverse = torch.empty_like(rows)
    inverse[rows] = torch.arange(s, device=rows.device)
    return torch.cat(outs).index_select(0, inverse).unsqueeze(0), None


def register() -> None:
    """Register :data:`NAMES` (:func:`varlen_attention` of each implementation) with transformers'
    ``AttentionInterface``, each with that implementation's mask builder. Idempotent; new names only (no existing
    implementation changes)."""
    global _registered
    if _registered:
        return
    import functools

    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface
    for implementation, name in NAMES.items():
        AttentionInterface.register(name, functools.partial(varlen_attention, implementation=implementation))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[implementation])
    _registered = True


# ---- the patch (tigon.patch / tigon.unpatch, instance level) -----------------------------------------------------
CLASS_NOTE = ("the vision tower's packed attention is batched by chunk length per model only (it switches the vision "
              "config's attention implementation)")


def _detail(implementation: str) -> str:
    return (f"the vision tower's packed {implementation} attention (one call per chunk: image, frame or window) -> "
            f"varlen_attention: one {implementation} call per distinct chunk length, the chunks stacked as a batch "
            f"(vision config._attn_implementation {NAMES[implementation]!r})")


def _modules(model: torch.nn.Module, specs):
    """(path, module) of every module of ``model`` whose class is one of the specs'
    :attr:`~tigon.integrations.family_spec.FamilySpec.varlen_attention`."""
    import importlib
    classes = tuple(c for sp in specs if sp.varlen_attention
                    for c in (getattr(importlib.import_module(sp.module), n, None) for n in sp.varlen_attention)
                    if c is not None)
    if not classes:
        return []
    return [(p, m) for p, m in model.named_modules() if isinstance(m, classes)]


def plan(model: torch.nn.Module, specs, report):
    """The actions switching ``model``'s sdpa / eager vision attention to :data:`NAMES` (one report entry per
    attention module; the switch itself is one per config object, on the model's own copy); skipped /
    already-patched entries go to ``report``."""
    from .plan import Action
    from .report import PatchEntry

    configs: dict[int, tuple[object, str]] = {}
    entries = []
    for path, m in _modules(model, specs):
        cfg = getattr(m, "config", None)
        impl = getattr(cfg, "_attn_implementation", None)
        if impl in NAMES.values():  # (a copy unpickled in another process: the names are registered again here)
            register()
            report.already_patched.append(PatchEntry("vision_attention", path, "instance level"))
        elif impl not in NAMES:
            why = " (flash attention takes the chunks as varlen already)" if "flash" in str(impl) else ""
            report.skipped.append(PatchEntry("vision_attention", path, f"config._attn_implementation is {impl!r}, "
                                             f"not sdpa or eager: that implementation is left alone{why}"))
        elif getattr(cfg, "output_attentions", False):
            report.skipped.append(PatchEntry("vision_attention", path, "config.output_attentions is set: left to "
                                             "transformers"))
        else:
            configs[id(cfg)] = (cfg, impl)
            entries.append(PatchEntry("vision_attention", path, _detail(impl)))
    if not entries:
        return []

    def apply():
        register()
        for implementation, name in NAMES.items():
            chosen = {key: cfg for key, (cfg, impl) in configs.items() if impl == implementation}
            if chosen:
                switch(model, chosen, name)

    return [Action(entries[0], apply)] + [Action(e, lambda: None) for e in entries[1:]]


def restore(model: torch.nn.Module, report) -> None:
    """Undo :func:`plan`: every config of ``model``'s modules set to one of :data:`NAMES` goes back to its
    implementation (``"sdpa"`` / ``"eager"``)."""
    from .report import PatchEntry

    for implementation, name in NAMES.items():
        configs, holders = switched(model, name)
        for path, m in holders:
            if type(m).__name__.endswith("VisionAttention"):
                report.replaced.append(PatchEntry("vision_attention", path or f"({type(m).__name__})",
                                                  f"{implementation} attention"))
        for cfg in configs.values():
            cfg._attn_implementation = implementation

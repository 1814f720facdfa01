"""Model families as data: what to replace in a Hugging Face modeling module, and how.

A :class:`FamilySpec` names classes and functions of one ``transformers.models.<family>.modeling_<family>`` module
and the few numbers that distinguish the family (RMSNorm casting mode and weight offset, the activation's config
attribute, LM-head softcapping / scaling). The engine in :mod:`tigon.integrations.engine` applies any spec; adding a
family is adding a spec here (and a tiny-config test), never writing a patch function.

Nothing here imports transformers: specs are strings until the engine resolves them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NormSpec:
    """A normalisation class whose ``forward`` becomes a Tigon op.

    cls: class name in the family module.
    kind: ``"rms_norm"`` (:func:`tigon.functional.rms_norm`) or ``"layer_norm"`` (:func:`tigon.functional.layer_norm`).
    casting_mode, offset: passed to rms_norm (``"llama"``/0.0 for Llama; ``"gemma"``/1.0 for Gemma's ``1 + w``).
    eps_attr: the instance attribute holding epsilon (``variance_epsilon`` in Llama, ``eps`` in Gemma).
    weight_attr, bias_attr: instance attributes holding the affine parameters (bias only for layer_norm).
    """

    cls: str
    kind: str = "rms_norm"
    casting_mode: str = "llama"
    offset: float = 0.0
    eps_attr: str = "variance_epsilon"
    weight_attr: str = "weight"
    bias_attr: str = "bias"


@dataclass(frozen=True)
class MLPSpec:
    """A gated MLP ``down(act(gate(x)) * up(x))`` whose ``forward`` becomes swiglu / geglu.

    cls: class name in the family module.
    act_config_attr: the attribute of the module's ``config`` naming the activation (``hidden_act``; Gemma2 uses
        ``hidden_activation``). See :data:`ACTIVATIONS` for the supported names.
    gate, up, down: attribute names of the three projections (any callables: nn.Linear, LoRA-wrapped Linear ...).
    """

    cls: str
    act_config_attr: str = "hidden_act"
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"


@dataclass(frozen=True)
class RopeSpec:
    """The module-global rotary function called by the family's attention classes.

    function: its name in the family module (``apply_rotary_pos_emb``); signature ``(q, k, cos, sin, unsqueeze_dim=1)``.
    layout: ``"rotate_half"`` (HF/NeoX halves, what :func:`tigon.functional.rope` implements); anything else
        (e.g. ``"interleaved"``) is reported as unsupported.
    attention_classes: the classes whose forward calls ``function``; at instance level the rotary kernel is
        enabled only while a patched instance of one of these runs (see :mod:`tigon.integrations.engine`).
    """

    function: str = "apply_rotary_pos_emb"
    layout: str = "rotate_half"
    attention_classes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CausalLMSpec:
    """The causal-LM class whose forward gets the fused LM head + loss in training.

    cls: class name in the family module.
    backbone, lm_head: attribute names of the decoder (called with every forward argument except
        ``head_only_args`` and ``return_dict``) and of the output projection (an ``nn.Linear``).
    output_class: the ModelOutput class the original forward returns (looked up in the family module first,
        then in ``transformers.modeling_outputs``).
    head_only_args: forward arguments consumed by the head/loss and not passed to the backbone.
    softcap_attr: config attribute with the final logit softcap (``final_logit_softcapping`` in Gemma 2), or None.
    logit_scale_attr: config attribute that multiplies the logits (Cohere's ``logit_scale``), or None.
    logit_divisor_attr: config attribute that divides the logits (Granite's ``logits_scaling``), or None.
    """

    cls: str
    backbone: str = "model"
    lm_head: str = "lm_head"
    output_class: str = "CausalLMOutputWithPast"
    head_only_args: tuple[str, ...] = ("labels", "logits_to_keep")
    softcap_attr: str | None = None
    logit_scale_attr: str | None = None
    logit_divisor_attr: str | None = None


@dataclass(frozen=True)
class FamilySpec:
    """Everything Tigon replaces in one model family.

    name: the family name accepted by :func:`tigon.patch` (``"llama"``); aliases: other accepted names.
    module: the modeling module (``"transformers.models.llama.modeling_llama"``); models are matched to a family
        by the module of their submodules' classes.
    norms, mlps, rope, causal_lm: the parts above; empty / None where the family has no such part.
    """

    name: str
    module: str
    norms: tuple[NormSpec, ...] = ()
    mlps: tuple[MLPSpec, ...] = ()
    rope: RopeSpec | None = None
    causal_lm: CausalLMSpec | None = None
    aliases: tuple[str, ...] = ()


# HF activation names (``transformers.activations.ACT2FN`` keys) -> (Tigon gated op, gelu approximation).
# gelu_new / gelu_fast / gelu_pytorch_tanh are the same tanh approximation written three ways.
ACTIVATIONS: dict[str, tuple[str, str | None]] = {
    "silu": ("swiglu", None),
    "swish": ("swiglu", None),
    "gelu": ("geglu", "none"),
    "gelu_pytorch_tanh": ("geglu", "tanh"),
    "gelu_new": ("geglu", "tanh"),
    "gelu_fast": ("geglu", "tanh"),
}


LLAMA = FamilySpec(
    name="llama",
    module="transformers.models.llama.modeling_llama",
    norms=(NormSpec("LlamaRMSNorm"),),
    mlps=(MLPSpec("LlamaMLP"),),
    rope=RopeSpec("apply_rotary_pos_emb", attention_classes=("LlamaAttention",)),
    causal_lm=CausalLMSpec("LlamaForCausalLM"),
)

MISTRAL = FamilySpec(
    name="mistral",
    module="transformers.models.mistral.modeling_mistral",
    norms=(NormSpec("MistralRMSNorm"),),
    mlps=(MLPSpec("MistralMLP"),),
    rope=RopeSpec("apply_rotary_pos_emb", attention_classes=("MistralAttention",)),
    causal_lm=CausalLMSpec("MistralForCausalLM"),
)

QWEN2 = FamilySpec(
    name="qwen2",
    module="transformers.models.qwen2.modeling_qwen2",
    norms=(NormSpec("Qwen2RMSNorm"),),
    mlps=(MLPSpec("Qwen2MLP"),),
    rope=RopeSpec("apply_rotary_pos_emb", attention_classes=("Qwen2Attention",)),
    causal_lm=CausalLMSpec("Qwen2ForCausalLM"),
)

QWEN3 = FamilySpec(  # Qwen2 plus per-head q_norm / k_norm (same RMSNorm class)
    name="qwen3",
    module="transformers.models.qwen3.modeling_qwen3",
    norms=(NormSpec("Qwen3RMSNorm"),),
    mlps=(MLPSpec("Qwen3MLP"),),
    rope=RopeSpec("apply_rotary_pos_emb", attention_classes=("Qwen3Attention",)),
    causal_lm=CausalLMSpec("Qwen3ForCausalLM"),
)

GEMMA = FamilySpec(  # (1 + w) in fp32, gelu-tanh gated MLP
    name="gemma",
    module="transformers.models.gemma.modeling_gemma",
    norms=(NormSpec("GemmaRMSNorm", casting_mode="gemma", offset=1.0, eps_attr="eps"),),
    mlps=(MLPSpec("GemmaMLP"),),
    rope=RopeSpec("apply_rotary_pos_emb", attention_classes=("GemmaAttention",)),
    causal_lm=CausalLMSpec("GemmaForCausalLM"),
)

GEMMA2 = FamilySpec(  # Gemma plus final logit softcapping
    name="gemma2",
    module="transformers.models.gemma2.modeling_gemma2",
    norms=(NormSpec("Gemma2RMSNorm", casting_mode="gemma", offset=1.0, eps_attr="eps"),),
    mlps=(MLPSpec("Gemma2MLP", act_config_attr="hidden_activation"),),
    rope=RopeSpec("apply_rotary_pos_emb", attention_classes=("Gemma2Attention",)),
    causal_lm=CausalLMSpec("Gemma2ForCausalLM", softcap_attr="final_logit_softcapping"),
)

FAMILIES: dict[str, FamilySpec] = {s.name: s for s in (LLAMA, MISTRAL, QWEN2, QWEN3, GEMMA, GEMMA2)}


def register_family(spec: FamilySpec, *, replace: bool = False) -> None:
    """Make ``spec`` available to :func:`tigon.patch` (by name and by model matching).

    Raises:
        ValueError: a family with that name exists and ``replace`` is False.
    """
    if spec.name in FAMILIES and not replace:
        raise ValueError(f"family {spec.name!r} is already registered (pass replace=True to override)")
    FAMILIES[spec.name] = spec


def family_by_name(name: str) -> FamilySpec:
    """The spec registered under ``name`` or one of its aliases (case-insensitive).

    Raises:
        ValueError: unknown name; the message lists the supported families.
    """
    key = name.lower()
    for spec in FAMILIES.values():
        if key == spec.name or key in spec.aliases:
            return spec
    raise ValueError(f"unknown model family {name!r}; supported families: {', '.join(sorted(FAMILIES))}")


def family_by_module(module_name: str) -> FamilySpec | None:
    """The spec whose modeling module is ``module_name``, or None."""
    for spec in FAMILIES.values():
        if spec.module == module_name:
            return spec
    return None

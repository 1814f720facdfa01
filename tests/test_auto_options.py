"""tigon.AutoModelForCausalLM checks Tigon's own options before transformers builds or loads the model: a typo in
``rms_norm="no"`` surfaced only after the weights were loaded (minutes for a large checkpoint)."""

import pytest

import tigon


class _NoLoad:
    """Stands for transformers' auto class: any build is a test failure (the options must be refused first)."""

    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise AssertionError("transformers was called before the options were checked")

    from_config = from_pretrained


@pytest.mark.parametrize("kwargs, error, match", [
    ({"rms_norm": "no"}, TypeError, "rms_norm must be True or False, got str 'no'"),
    ({"strict": 1}, TypeError, "strict must be True or False"),
    ({"fused_linear_cross_entropy": None}, TypeError, "fused_linear_cross_entropy must be True, False or a dict"),
    ({"fused_linear_cross_entropy": {"chunk": 1}}, ValueError, "unknown fused_linear_cross_entropy option 'chunk'"),
    ({"family": 3}, TypeError, "family must be a family name"),
])
def test_bad_patch_options_are_refused_before_loading(monkeypatch, kwargs, error, match):
    monkeypatch.setattr(tigon.AutoModelForCausalLM, "_hf", staticmethod(lambda: _NoLoad))
    with pytest.raises(error, match=match):
        tigon.AutoModelForCausalLM.from_pretrained("some/checkpoint", **kwargs)
    with pytest.raises(error, match=match):
        tigon.AutoModelForCausalLM.from_config(object(), **kwargs)


def test_unknown_family_is_refused_before_loading(monkeypatch):
    monkeypatch.setattr(tigon.AutoModelForCausalLM, "_hf", staticmethod(lambda: _NoLoad))
    with pytest.raises(ValueError, match="unknown model family 'lama'"):
        tigon.AutoModelForCausalLM.from_pretrained("some/checkpoint", family="lama")


def test_patch_names_a_family_of_the_wrong_type():
    """tigon.patch(model, family=3) raised AttributeError ('int' object has no attribute 'lower')."""
    import torch

    with pytest.raises(TypeError, match="family must be a family name"):
        tigon.patch(torch.nn.Linear(2, 2), family=3)

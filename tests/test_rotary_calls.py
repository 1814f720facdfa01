"""tigon.integrations.rotary_calls: which rotary functions an attention forward calls for one instance."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tigon.integrations.rotary_calls import reach, rotary_functions

SOURCE = '''
def apply_rotary_pos_emb(q, k, cos, sin):
    return q, k


def apply_rotary_pos_emb_interleave(q, k, cos, sin):
    return q, k


def helper(q, k, cos, sin):
    return apply_rotary_pos_emb(q, k, cos, sin)


class Config:
    rope_interleave = True


class Attention:
    def __init__(self, interleave, use_rope=True, training=False):
        self.config, self.use_rope, self.training = Config(), use_rope, training
        self.config.rope_interleave = interleave

    def forward(self, q, k, cos, sin, cache=None):
        if self.use_rope and not self.training:  # `training` changes after patching: never decided
            if self.config.rope_interleave:
                q, k = apply_rotary_pos_emb_interleave(q, k, cos, sin)
            else:
                q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:  # a condition on the arguments keeps both branches
            q = q
        return q, k


class ByMode:
    training = True

    def forward(self, q, k, cos, sin):
        if self.training:
            return apply_rotary_pos_emb_interleave(q, k, cos, sin)
        return apply_rotary_pos_emb(q, k, cos, sin)


class ViaHelper:
    def forward(self, q, k, cos, sin):
        return helper(q, k, cos, sin)
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    path = tmp_path_factory.mktemp("rotary") / "toy_rotary_module.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("toy_rotary_module", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_branch_the_instance_takes(toy):
    assert rotary_functions(toy.Attention) == {"apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave"}
    interleaved = reach(toy.Attention(True), "apply_rotary_pos_emb")
    assert interleaved.called == {"apply_rotary_pos_emb_interleave"}
    assert interleaved.decided == ("self.config.rope_interleave is True",)
    assert reach(toy.Attention(False), "apply_rotary_pos_emb").called == {"apply_rotary_pos_emb"}


def test_a_nope_layer_calls_nothing(toy):
    nope = reach(toy.Attention(False, use_rope=False), "apply_rotary_pos_emb")  # False and ...: short circuit
    assert nope.called == frozenset() and nope.decided == ("self.use_rope and (not self.training) is False",)


def test_undecidable_conditions_keep_both_branches(toy):
    # the training flag changes after patching: never decided, both branches count
    assert reach(toy.ByMode(), "apply_rotary_pos_emb").called == {"apply_rotary_pos_emb",
                                                                  "apply_rotary_pos_emb_interleave"}


def test_a_call_through_a_helper_cannot_be_told(toy):
    assert reach(toy.ViaHelper(), "apply_rotary_pos_emb") is None

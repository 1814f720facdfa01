"""The top-level ``tigon`` namespace: ``__all__`` and ``dir(tigon)`` list the whole public API, lazy names included."""

import inspect

import pytest

import tigon

PUBLIC = {"patch", "unpatch", "PatchReport", "AutoModelForCausalLM", "force_reference", "set_strict",
          "UnsupportedError", "TigonFallbackWarning", "functional", "nn", "support", "integrations", "reference",
          "ops", "numerics", "presets", "workflows", "checkpointing", "__version__"}


def test_dir_lists_the_lazy_names_without_loading_them(monkeypatch):
    def refuse(name):
        raise AssertionError(f"dir(tigon) imported {name}")

    monkeypatch.setattr(tigon, "_importlib", type("NoImport", (), {"import_module": staticmethod(refuse)}))
    names = dir(tigon)
    assert {"patch", "unpatch", "AutoModelForCausalLM", "nn"} <= set(names)
    assert set(tigon.__all__) <= set(names) and names == sorted(names)


def test_all_is_the_public_api_and_every_name_resolves():
    assert set(tigon.__all__) == PUBLIC
    assert len(tigon.__all__) == len(set(tigon.__all__))
    for name in tigon.__all__:
        assert getattr(tigon, name) is not None, name
    # after loading everything, no public non-module attribute is missing from __all__
    extra = {n for n, v in vars(tigon).items() if not n.startswith("_") and not inspect.ismodule(v)}
    assert extra <= set(tigon.__all__), extra
    assert set(tigon.__all__) <= set(dir(tigon))


def test_public_callables_have_docstrings():
    for name in tigon.__all__:
        obj = getattr(tigon, name)
        if callable(obj) or inspect.ismodule(obj):
            assert (obj.__doc__ or "").strip(), f"tigon.{name} has no docstring"


def test_unknown_attribute_names_it():
    try:
        tigon.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("no AttributeError")


@pytest.mark.parametrize("value", ["false", "yes", 0, 1, None])
def test_set_strict_takes_bools_only(value, monkeypatch):
    monkeypatch.delenv("TIGON_STRICT", raising=False)
    with pytest.raises(TypeError, match="enabled must be True or False"):
        tigon.set_strict(value)
    assert not tigon.support.is_strict()  # unchanged


def test_force_reference_called_without_with_warns_and_changes_nothing():
    import gc

    from tigon import support

    with pytest.warns(RuntimeWarning, match="without `with`"):
        tigon.force_reference()
        gc.collect()
    assert not support._forced()
    with tigon.force_reference():
        assert support._forced()
        with tigon.force_reference():  # nested: the outer one still holds on leaving
            pass
        assert support._forced()
    assert not support._forced()


def test_functional_namespace_has_no_import_leftovers():
    from tigon import functional

    public = {n for n in dir(functional) if not n.startswith("_")}
    assert public - set(functional.__all__) == {"OPS"}  # (no `annotations` from a __future__ import)

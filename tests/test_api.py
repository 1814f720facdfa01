"""The top-level ``tigon`` namespace: ``__all__`` and ``dir(tigon)`` list the whole public API, lazy names included."""

import inspect

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

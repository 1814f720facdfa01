"""tigon.kernels._common.launch: the cached direct launch of compiled Triton kernels (on by default;
``TIGON_DIRECT_LAUNCH=0`` turns it off).

There is no compiled launcher under the interpreter, so these tests drive the cache and fallback logic with a fake
kernel shaped like Triton's JITFunction (its ``device_caches`` binder, ``kernel[grid]`` returning a compiled kernel
with ``run`` / ``function`` / ``packed_metadata``); the launch itself is checked on the GPU (benchmarks/host_issue.py
and every kernel test on CUDA, where it is the default)."""

from __future__ import annotations

import pytest

from tigon.kernels import _common

_HOOKS_ACTIVE = _common._launch_hooks_active  # (the real one: the fixture below replaces it)


class FakeCompiled:
    def __init__(self, log):
        self.log, self.function, self.packed_metadata = log, "fn", "meta"

    def run(self, *a):
        self.log.append(("direct", a))


class FakeKernel:
    """Specializes on whether each int argument is 1 and on the constexprs' values, as Triton's binder does (a
    coarse stand-in)."""

    def __init__(self):
        self.log, self.pre_run_hooks = [], []
        self.compiled = FakeCompiled(self.log)

        def binder(*args, **kwargs):
            opts = {k: v for k, v in kwargs.items() if k == "num_warps"}
            params = {**{f"a{i}": a for i, a in enumerate(args)}, **{k: v for k, v in kwargs.items() if k not in opts}}
            consts = [("constexpr", v) for k, v in kwargs.items() if k not in opts]
            return params, [("i32", "1" if a == 1 else None) for a in args] + consts, opts

        self.device_caches = {0: ({}, {}, None, None, binder)}

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("jit", grid, args))
            return self.compiled
        return run


@pytest.fixture
def direct(monkeypatch):
    monkeypatch.setenv("TIGON_DIRECT_LAUNCH", "1")
    monkeypatch.setattr(_common, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(_common, "_current_device", lambda: 0)
    monkeypatch.setattr(_common, "_current_stream", lambda device: 77)
    monkeypatch.setattr(_common, "_direct_broken", [])
    monkeypatch.setattr(_common, "_launch_hooks_active", lambda: False)
    monkeypatch.setattr(_common, "_HOOK_CHAINS", [])  # (so the replacement above is asked at every launch)


def test_on_by_default_off_by_env_and_under_the_interpreter(monkeypatch):
    monkeypatch.delenv("TIGON_DIRECT_LAUNCH", raising=False)
    monkeypatch.setattr(_common, "_direct_broken", [])
    monkeypatch.setattr(_common, "interpreter_enabled", lambda: False)
    assert _common.direct_launch_enabled()  # the default on compiled kernels
    monkeypatch.setenv("TIGON_DIRECT_LAUNCH", "0")
    assert not _common.direct_launch_enabled()
    k = FakeKernel()
    assert _common.launcher(k) is k
    _common.launch(k, (3,), 5, 6, BLOCK=4, num_warps=2)
    _common.launch(k, (3,), 5, 6, BLOCK=4, num_warps=2)
    assert [e[0] for e in k.log] == ["jit", "jit"]
    monkeypatch.delenv("TIGON_DIRECT_LAUNCH")
    monkeypatch.setattr(_common, "interpreter_enabled", lambda: True)
    assert not _common.direct_launch_enabled()  # under the interpreter there is no compiled launcher
    assert _common.launcher(k) is k


def test_first_launch_compiles_then_the_launcher_is_called(direct):
    k = FakeKernel()
    assert _common.launch(k, (3,), 5, 6, BLOCK=4, num_warps=2) is k.compiled
    assert _common.launch(k, (3, 2), 7, 8, BLOCK=4, num_warps=2) is None  # same specialization: direct
    assert k.log[0] == ("jit", (3,), (5, 6))
    assert k.log[1] == ("direct", (3, 2, 1, 77, "fn", "meta", None, None, None, 7, 8, 4))
    _common.launch(k, (3,), 1, 6, BLOCK=4, num_warps=2)  # another specialization (an int equal to 1): compiles
    _common.launch(k, (3,), 5, 6, BLOCK=8, num_warps=2)  # another constexpr
    _common.launch(k, (3,), 5, 6, BLOCK=4, num_warps=4)  # another option
    assert [e[0] for e in k.log[2:]] == ["jit", "jit", "jit"]
    _common.launch(k, (1, 1, 9), 1, 6, BLOCK=4, num_warps=2)
    assert k.log[-1] == ("direct", (1, 1, 9, 77, "fn", "meta", None, None, None, 1, 6, 4))


def test_hooks_and_callable_grids_take_kernel_grid(direct, monkeypatch):
    k = FakeKernel()
    _common.launch(k, (3,), 5, 6, BLOCK=4)
    monkeypatch.setattr(_common, "_launch_hooks_active", lambda: True)  # a profiler's launch hook
    _common.launch(k, (3,), 5, 6, BLOCK=4)
    monkeypatch.setattr(_common, "_launch_hooks_active", lambda: False)
    monkeypatch.setattr(_common, "_HOOK_CHAINS", [])  # (so the replacement above is asked at every launch)
    _common.launch(k, lambda meta: (3,), 5, 6, BLOCK=4)
    k.pre_run_hooks.append(print)
    _common.launch(k, (3,), 5, 6, BLOCK=4)
    assert [e[0] for e in k.log] == ["jit"] * 4


def test_an_unexpected_triton_turns_it_off_with_a_warning(direct):
    k = FakeKernel()
    k.device_caches = {}  # private layout changed
    with pytest.warns(RuntimeWarning, match="TIGON_DIRECT_LAUNCH: binding the arguments failed"):
        _common.launch(k, (3,), 5, 6, BLOCK=4)
    assert not _common.direct_launch_enabled()
    _common.launch(k, (3,), 5, 6, BLOCK=4)
    assert [e[0] for e in k.log] == ["jit", "jit"]
    k2 = FakeKernel()
    k2.compiled.function = None  # no loaded function on the compiled kernel
    _common._direct_broken.clear()
    with pytest.warns(RuntimeWarning, match="no usable launcher"):
        _common.launch(k2, (3,), 5, 6, BLOCK=4)
    assert not _common.direct_launch_enabled()


def test_launch_hooks_read_from_triton():
    assert _common._launch_hooks_active() is False


def test_launcher_is_the_kernel_itself_while_off(monkeypatch, direct):
    k = FakeKernel()
    via = _common.launcher(k)
    assert via is not k
    via[(3,)](5, 6, BLOCK=4)
    via[(3,)](5, 6, BLOCK=4)
    assert [e[0] for e in k.log] == ["jit", "direct"]
    monkeypatch.setenv("TIGON_DIRECT_LAUNCH", "0")
    assert _common.launcher(k) is k  # the launch sites index and call the kernel as before: no extra layer


def test_one_stand_in_per_kernel(direct):
    k, k2 = FakeKernel(), FakeKernel()
    via = _common.launcher(k)
    assert _common.launcher(k) is via and _common.launcher(k2) is not via  # made once per kernel
    via[(3,)](5, 6, BLOCK=4)
    via[(2,)](5, 6, BLOCK=4)
    assert [e[0] for e in k.log] == ["jit", "direct"] and k.log[1][1][:3] == (2, 1, 1)


def test_a_registered_triton_launch_hook_takes_kernel_grid(monkeypatch):
    """The real check (triton.knobs.runtime's HookChains, read inline once seen): a hook added after direct launches
    began sends the next launch through ``kernel[grid]``, and removing it brings the direct path back."""
    from triton import knobs

    monkeypatch.setenv("TIGON_DIRECT_LAUNCH", "1")
    monkeypatch.setattr(_common, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(_common, "_current_device", lambda: 0)
    monkeypatch.setattr(_common, "_current_stream", lambda device: 77)
    monkeypatch.setattr(_common, "_direct_broken", [])
    k = FakeKernel()
    for _ in range(2):
        _common.launch(k, (3,), 5, 6, BLOCK=4)
    hook = lambda *a, **kw: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        _common.launch(k, (3,), 5, 6, BLOCK=4)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    _common.launch(k, (3,), 5, 6, BLOCK=4)
    assert [e[0] for e in k.log] == ["jit", "direct", "jit", "direct"]


def test_grids_are_remembered_per_kernel_and_bounded(direct, monkeypatch):
    k = FakeKernel()
    via = _common.launcher(k)
    assert via[(3,)] is via[(3,)]  # a C dict lookup once seen (no Python frame)
    monkeypatch.setattr(_common, "MAX_GRIDS", 4)
    for g in range(10):
        via[(g,)](5, 6, BLOCK=4)
    assert len(via) <= 4
    grid = lambda meta: (3,)  # noqa: E731 - a callable grid: not kept, launched through kernel[grid]
    via[grid](5, 6, BLOCK=4)
    assert grid not in via and k.log[-1][0] == "jit"


def test_python_frames_per_direct_launch(direct, monkeypatch):
    """The host budget of a launch on the CUDA path: ``launcher(kernel)[grid](*args)`` of a kernel launched before
    runs two of Tigon's Python frames (:func:`launcher` and ``_launch_direct``; Triton's binder is the fake's here) and
    no other (the device, the stream and the launch hooks are read without a call of Tigon's)."""
    import sys

    monkeypatch.setattr(_common, "_current_device", int)  # C callables, as torch's own are on CUDA: no frame
    monkeypatch.setattr(_common, "_current_stream", abs)
    monkeypatch.setattr(_common, "_launch_hooks_active", _HOOKS_ACTIVE)
    monkeypatch.setattr(_common, "interpreter_enabled", _common._INTERPRETER_ENABLED)  # launcher's inline reads
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    k = FakeKernel()
    for _ in range(2):
        _common.launcher(k)[(3,)](5, 6, BLOCK=4)
    assert _HOOKS_ACTIVE() is False and _common._HOOK_CHAINS  # the chains seen: read inline from now on
    frames = []

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == _common.__file__:
            frames.append(frame.f_code.co_name)

    sys.setprofile(prof)
    try:
        _common.launcher(k)[(3,)](5, 6, BLOCK=4)
    finally:
        sys.setprofile(None)
    assert frames == ["launcher", "_launch_direct"]
    assert k.log[-1][0] == "direct"


@pytest.mark.parametrize("direct_env", [None, "0", "1"])
@pytest.mark.parametrize("interpret", ["0", "1"])
def test_launch_mode_answers_as_compiled_cuda_and_launcher(monkeypatch, direct_env, interpret):
    """launch_mode(device): compiled_cuda(device) and launcher(kernel) in one call, the same answers under every
    switch (the environment's, the direct path turned off, a replaced interpreter_enabled or os.environ)."""
    import os

    import torch

    monkeypatch.setattr(_common, "_direct_broken", [])
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    if direct_env is None:
        monkeypatch.delenv("TIGON_DIRECT_LAUNCH", raising=False)
    else:
        monkeypatch.setenv("TIGON_DIRECT_LAUNCH", direct_env)
    k = FakeKernel()

    def check():
        for device in (torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda")):
            for _ in range(2):  # (a device not seen yet, then seen)
                mode = _common.launch_mode(device)
                assert mode.compiled is _common.compiled_cuda(device)
                assert mode[k] is _common.launcher(k) and mode[k] is mode[k]

    check()
    _common._direct_broken.append("broken")
    check()
    _common._direct_broken.clear()
    monkeypatch.setattr(_common, "interpreter_enabled", lambda: interpret == "0")  # (replaced: asked, not read)
    check()
    monkeypatch.setattr(os, "environ", dict(os.environ))  # (a mock environ: read through os.environ.get)
    monkeypatch.setattr(_common.support.os, "environ", os.environ)
    check()


def test_launch_mode_remembers_kernels_within_a_bound(monkeypatch):
    import torch

    monkeypatch.setattr(_common, "MAX_KERNELS", 4)
    mode = _common.launch_mode(torch.device("cpu"))
    for _ in range(10):
        k = FakeKernel()
        assert mode[k] is _common.launcher(k)
    assert len(mode) <= 4

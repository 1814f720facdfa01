"""Run the same tests compiled on CUDA and through Triton's interpreter on CPU.

TRITON_INTERPRET must be set before any Triton kernel is defined, so this happens before tigon is imported.
"""

import gc
import os
import pickle
import sys
import zlib

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The tests' tiny models would run their original MLP on a GPU (a patched MLP's host-bound choice, OpSpec.
# host_bound_elements): the kernels at every size, unless a test asks for the choice (tests/test_host_bound.py).
os.environ.setdefault("TIGON_HOST_BOUND_ELEMENTS", "0")
# fp32 means fp32 in the tests' comparisons with 1e-5 bounds: cuDNN's convolutions default to TF32 on Ampere and later
# (torch.backends.cudnn.allow_tf32), which moved gradients reached through a convolution (Qwen2-VL's patch embedding,
# the causal conv1d of Qwen3-Next's linear attention) by 1e-4 between two runs on an H100. (Matmuls default to fp32.)
torch.backends.cudnn.allow_tf32 = False
# One console width in every run (rich reads COLUMNS): a terminal's, a pipe's 80 columns and an xdist worker's
# differ, and the tools' tables and paths wrap with them.
os.environ["COLUMNS"] = "160"

import pytest  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# ---- the CUDA compile check (tests/cuda_compile.py): TIGON_CUDA_COMPILE=1 on an interpreted run ------------------
_CUDA_COMPILE = None
if os.environ.get("TIGON_CUDA_COMPILE") == "1" and os.environ.get("TRITON_INTERPRET") == "1":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cuda_compile  # noqa: E402

    _CUDA_COMPILE = cuda_compile.Recorder(prefix="tigon.")
    _CUDA_COMPILE.install()


# Under pytest-xdist (``make test`` runs ``-n``), each worker hands its launches to the controller, which compiles the
# union once: a kernel variant two workers launched compiles once, and the check's failures reach one report.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    # Each worker gets its share of the cores for torch's intra-op threads (two workers with two threads each on
    # two cores run slower than with one each).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


# The modules with the longest set-ups and tests (multi-process launches, compiled steps, the profiler), first: under
# xdist's --dist loadfile a module runs whole on one worker, so one of these started last would leave the other
# worker idle while it finishes (tens of seconds of a 2-core CI run).
FIRST = ("test_distributed.py", "test_trainer_distributed.py", "test_profile.py", "test_bench.py", "test_verify.py",
         "test_dtensor.py", "test_compile.py", "test_causal_mask.py")


def pytest_collection_modifyitems(session, config, items):
    """Run :data:`FIRST`'s modules first (a stable sort: each module's own order is kept)."""
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """(pytest-xdist, on the controller) Take a finished worker's interpreted launches into the session's check."""
    data = getattr(node, "workeroutput", {}).get("tigon_launches")
    if _CUDA_COMPILE is not None and data:
        for key, calls in pickle.loads(data).items():
            _CUDA_COMPILE.launches.setdefault(key, set()).update(calls)


def pytest_sessionfinish(session, exitstatus):
    """Compile every kernel variant the session interpreted for sm_90 (``TIGON_CUDA_COMPILE=1``): a variant the
    compiler refuses fails the session. An xdist worker hands its launches to the controller instead."""
    if _CUDA_COMPILE is None:
        return
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["tigon_launches"] = pickle.dumps(_CUDA_COMPILE.launches)
        return
    if not _CUDA_COMPILE.launches:
        return
    _CUDA_COMPILE.uninstall()
    if os.environ.get("TIGON_CUDA_COMPILE_SAVE"):  # the session's launches, for `python tests/cuda_compile.py PATH`
        _CUDA_COMPILE.save(os.environ["TIGON_CUDA_COMPILE_SAVE"])
    result = cuda_compile.run_check(_CUDA_COMPILE, workers=int(os.environ.get("TIGON_CUDA_COMPILE_WORKERS", "2")))
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write("\n")
        tr.write_sep("-", "CUDA compile check")
    say = tr.write_line if tr is not None else print
    if result["skipped"]:
        say(f"CUDA compile check skipped: {result['skipped']}")
        return
    say(f"CUDA compile check (sm_{cuda_compile.TARGET[1]}): {result['variants']} variants of {result['kernels']} "
        f"kernels the tests launched, {len(result['failures'])} failed, {result['seconds']} s")
    for note in result["notes"]:
        say(f"  note: {note}")
    for f in result["failures"]:
        say(f"  FAILED {f['kernel']} signature={f.get('signature')} constexprs={f.get('constexprs')} "
            f"options={f.get('options')}:\n    {f['error']}")
    if result["failures"]:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    # Fresh random inputs per test, but reproducible from the test's name when a failure must be replayed.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield


@pytest.fixture(autouse=True)
def _release_dropped_patches():
    # A test that patched models and dropped them without unpatch leaves their rotary dispatchers installed until a
    # collection: tests that check the global patch state (tigon inspect's dry run) must not see another test's.
    yield
    engine = sys.modules.get("tigon.integrations.engine")
    if engine is not None and engine.SWITCHES:
        gc.collect()  # (a full collection costs up to ~1 s with many modeling modules imported: only when needed)
        engine.release_unused()


class KernelCount:
    """Counts, while active, the Triton launches of the kernels stubbed with :meth:`stub` (they do not run) and the
    ATen operations that would run a kernel (views, allocations and detach aside): what one call of an op issues."""

    FREE = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
            "lift_fresh")

    def __init__(self, monkeypatch):
        self.monkeypatch, self.launches, self.aten = monkeypatch, [], []

    def stub(self, module, *names):
        for name in names:
            self.monkeypatch.setattr(module, name, self._Stub(name, self.launches))

    class _Stub:
        def __init__(self, name, log):
            self.name, self.log = name, log

        def __getitem__(self, grid):
            return lambda *a, **k: self.log.append(self.name)

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        aten, free = self.aten, self.FREE

        class Count(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not func.is_view and func.overloadpacket.__name__ not in free:
                    aten.append(func.overloadpacket.__name__)
                return func(*args, **(kwargs or {}))

        self.launches.clear()
        self.aten.clear()
        self.mode = Count()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


@pytest.fixture
def kernel_count(monkeypatch) -> KernelCount:
    """A :class:`KernelCount` whose stubs are undone after the test."""
    return KernelCount(monkeypatch)


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters reset before and after the test (``pytestmark =
    pytest.mark.usefixtures("fresh_dynamo")`` in a compile test file): each test counts its own compiles."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()

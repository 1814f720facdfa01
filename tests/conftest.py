"""Run the same tests compiled on CUDA and through Triton's interpreter on CPU.

TRITON_INTERPRET must be set before any Triton kernel is defined, so this happens before tigon is imported.
"""

import os
import zlib

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The tests' tiny models would run their original MLP on a GPU (a patched MLP's host-bound choice, OpSpec.
# host_bound_elements): the kernels at every size, unless a test asks for the choice (tests/test_host_bound.py).
os.environ.setdefault("TIGON_HOST_BOUND_ELEMENTS", "0")

import pytest  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    # Fresh random inputs per test, but reproducible from the test's name when a failure must be replayed.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield

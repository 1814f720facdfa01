"""Plain-PyTorch definitions of every Tigon op: the specification, the test oracle and the CPU fallback.

Each function has the same signature and semantics as its counterpart in :mod:`tigon.functional`.
"""

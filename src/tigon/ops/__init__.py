"""Triton kernels, one op per module. Import through :mod:`tigon.functional`, which picks the backend."""

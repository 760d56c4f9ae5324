"""Kernels: our SM90 Triton kernels, one directory each (kernel.py, op.py, reference.py, README.md).

Imports only torch and triton. Nothing here imports another part of hpc_advise.
"""

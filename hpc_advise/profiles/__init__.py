"""Profiles: GPU (TOML) and model (JSON) profiles as package data, loaded into frozen dataclasses.

Imports only the standard library. Never imports torch, triton, ``kernels`` or ``runtime``.
"""

"""Knowledge base: SQLite (sqlite-utils) with migrations, full-text search, importers and the CLI.

May import: ``profiles``, sqlite-utils, the standard library. Never imports torch, triton, ``kernels``
or ``runtime``.
"""

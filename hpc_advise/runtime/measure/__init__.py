"""What ``hpc-advise profile`` runs and stores: the command (``cli.py``), its stages (``profile.py``),
the timing harness and results writer (``harness.py``), the copy/GEMM microbenchmarks
(``microbench.py``), the collectives benchmark (``comm.py``) and the one-host multi-process launcher
(``dist_run.py``). Each measurement is a knowledge-base ``runs`` row.
"""

"""``python -m hpc_advise``: the same entry point as the ``hpc-advise`` console script."""

from hpc_advise.cli import main

main()

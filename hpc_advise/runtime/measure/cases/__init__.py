"""Kernel benchmarks, one module per kernel: ``bench(grid='full'|'small', peers=True)`` returns
``(rows, table, headers)`` (rows are ``hpc_advise.runtime.measure.harness.run_row`` dicts). The thin scripts
``benchmarks/bench_<name>.py`` write the committed tables; ``hpc-advise profile --bench`` runs
``bench(grid='small')`` of each and stores the rows in the knowledge base."""

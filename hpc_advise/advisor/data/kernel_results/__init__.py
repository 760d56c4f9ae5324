"""Copies of committed kernel benchmark tables (benchmarks/results/<name>.jsonl, one H200, 2026-11-29),
shipped so an installed advisor fits its kernel models offline; a checkout reads the originals."""

"""Kernel benchmark tables the advisor fits its per-operator kernel models on (knowledge-base ``runs``
rows, one ``<bench>.jsonl`` per bench), written here by the bench's explicit ship step: the advisor
reads these and never a checkout's ``benchmarks/results/``, so a checkout and a wheel answer alike."""

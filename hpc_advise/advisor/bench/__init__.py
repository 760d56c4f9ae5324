"""``hpc-advise bench`` and ``validate``: trace replay against a live OpenAI-compatible server.

Parts: ``client`` (HTTP: probe, one streamed completion), ``prompts`` (exact or approximate token
lengths, shared prefix blocks), ``replay`` (the plan from a trace; open and closed loop, A/B
interleaving, Ctrl-C), ``stats`` (percentiles with bootstrap intervals, goodput, A/B differences),
``gpu`` (NVML sampling when the server is local), ``consistency`` (greedy agreement, teacher-forced
KL through ``/generate``), ``records`` (bench_serving JSONL and knowledge-base rows), ``validate``
(predicted vs measured), ``run`` (one run end to end), ``cli`` (click commands). See docs/bench.md.
"""

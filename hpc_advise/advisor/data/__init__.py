"""Seed training data shipped with hpc-advise (package data, read with ``importlib.resources``).

- ``serving_measurements_train.csv.gz``: measured end-to-end TTFT/TPOT of real deployments, a gzip copy
  of shared/data/serving_measurements_train.csv: rows of NVIDIA AIConfigurator's public
  ``silicon_sample.csv`` (aiconfigurator-core 0.12.0; Apache-2.0, copyright NVIDIA), measured by NVIDIA
  with SGLang, vLLM and TensorRT-LLM on H100/H200/B200/B300/GB200/GB300. SGLang-on-H100/H200 rows are
  held out by the data owner to evaluate the model; never add rows from that source here.
- ``kernel_seed.jsonl``: kernel timings of the team's reference H200 run (shared DESIGN §7)
  as knowledge-base ``runs`` rows, the per-operator efficiency models' prior when no local
  measurements exist.
- ``serving_model.npz`` and ``attention_model.json``: the serving model and the decode-attention
  model fitted on the files here alone (``serving_model``, ``kernel_models``), so the advisor neither
  fits nor imports scikit-learn or scipy unless the knowledge base adds measurements.
  ``tests/advisor/test_shipped_data.py`` checks them against fresh fits;
  ``HPC_ADVISE_WRITE_GOLDENS=1`` rewrites them there.
"""

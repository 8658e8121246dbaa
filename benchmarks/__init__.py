"""Benchmarks that reproduce the Speculative Rejection paper's measurements on models we can run.

`python -m benchmarks <experiment> ...`; experiments: table1, counterfactual, memory, efficiency and
perplexity (the NeurIPS version's metric and Table 2), engine, kvcache (a proposed engine change,
measured), step (one decode step per weight format next to the machine's roofline and llama.cpp),
signals (pruning signals side by side on the same candidates), tune (alpha and first decision
point from saved counterfactual data) and app (the explorer's click-to-frame times in a browser).
Each experiment is a function taking a loaded generator and reward (so tests can reuse them),
and writes a JSON result file (settings, environment, results) and a plotly HTML plot; app drives
a running app in a browser instead and writes the JSON only.
"""

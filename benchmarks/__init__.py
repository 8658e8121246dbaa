"""Benchmarks that reproduce the Speculative Rejection paper's measurements on models we can run, and measure the
explorer itself. `python -m benchmarks <experiment> ...` (`--help` lists them); the experiments:

- the paper's: table1 (Table 1), counterfactual (Figure 3), memory (Figure 4), efficiency (the NeurIPS
  version's metric), perplexity (its Table 2);
- the engine and its decode step: engine (our Best-of-N against `model.generate`), step (one decode step per
  weight format next to the machine's roofline and llama.cpp), machines (every decode path under each emulated
  CPU class), gpu-check (one command on a bare GPU machine);
- the method's choices: signals (pruning signals side by side on the same candidates), tune (alpha and first
  decision point from saved signals data), ifeval (IFEval prompts with the ifeval reward);
- the app: app (click-to-frame times in a browser), load (simulated visitors during a generation);
- report: the docs' result tables, rewritten from the result files.

Each experiment writes a JSON result file (settings, environment, results), most also a plotly HTML plot; its
work is a function taking a loaded generator and reward, so tests reuse it.
"""

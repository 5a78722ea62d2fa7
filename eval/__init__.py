"""Evaluation: the paper's eight zero-shot benchmarks through lm-eval (`eval.runner`), validation perplexity
(`eval.perplexity`) and routing analysis (`eval.routing`, pictures in `eval.routing_plots`).

Kept free of heavy imports: the `delta-qwen3` command line imports `eval.cli` for every subcommand.
"""

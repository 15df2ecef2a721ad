"""Logs of a run: OUT/metrics.jsonl with TensorBoard and W&B (`metrics`), the step metrics and
the end-of-run report (`steps`, `summary`), stage progress, plots and the episode viewer."""

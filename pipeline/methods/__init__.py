"""The paper's methods and ours beyond it: ablation, iterative and budgeted pruning, importance criteria and the
speed benchmarks, each driven by a stage through the Task protocol."""

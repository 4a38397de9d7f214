"""Commands run by hand, never by a stage: studies that choose a default (mt_budget, widths), the benchmarks on
random weights (bench, llm_bench), and the developer's renderers of the report and of the `dvc plots` template
(report, plots_template). The library modules they drive only import; their command lines live here. Not a stage
dependency, so editing a study reruns no stage."""

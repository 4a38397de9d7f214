"""Report renderer and offline DVC plots template: synthetic inputs, no network, a few seconds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipeline.files.schema import (
    ABOUT_FILE,
    FINETUNE_SUMMARY,
    IMPORTANCE,
    KINDS,
    KV_GROUPS_TABLE,
    METRIC_AT_PRUNABLE,
    NOT_STOCK_BECAUSE,
    PRUNABLE_FRACTION,
    STOCK,
    TABLE_COLUMNS,
    UNPRUNED_METRIC,
    UNPRUNED_MODEL,
    checkpoint_method,
    kind_method,
    kv_groups_label,
)
from pipeline.methods.pruning import prunable_fraction
from pipeline.report import plots_template
from pipeline.report.build import build_report

FRACTIONS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
# Importance curve: within 1 point up to 30% (84.6 -> 83.7), then 82.0 at 40%. The 50% level is back
# within 1 point on purpose: the walk must stop at the first level that loses more than a point.
IMPORTANCE_TEST = [84.6, 84.5, 84.2, 83.7, 82.0, 84.0, 75.0, 70.0, 60.0]
RANDOM_TEST = [84.6, 84.0, 82.0, 80.0, 78.0, 76.0, 70.0, 60.0, 50.0]
ROOT = Path(__file__).resolve().parents[1]
EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?(?:https?:)?//""", re.I)


def _write_curve(report_dir: Path, methods: dict[str, list[float]], splits=("dev", "test"),
                 metric: str = "accuracy") -> None:
    rows = []
    for split in splits:
        for method, metrics in methods.items():
            for f, m in zip(FRACTIONS, metrics, strict=True):
                rows.append(
                    {
                        "method": method,
                        "split": split,
                        "fraction_pruned": f,
                        "heads_pruned": round(144 * f),
                        "metric": m,
                    }
                )
    curve = pd.DataFrame(rows)
    curve.to_csv(report_dir / "pruning_curve.csv", index=False)
    if IMPORTANCE in methods:  # what the prune stage writes beside the curve, and the report quotes
        summary = {}
        for split in splits:
            fraction, at, base = prunable_fraction(curve, IMPORTANCE, split, metric)
            summary[split] = {PRUNABLE_FRACTION: fraction, METRIC_AT_PRUNABLE: at, UNPRUNED_METRIC: base}
        (report_dir / "prune.json").write_text(json.dumps(summary))


def _write_finetune(report_dir: Path, metrics: dict, about: dict) -> None:
    """What the finetune stage writes: its metrics (numbers only) and what the experiment is (about.json)."""
    (report_dir / FINETUNE_SUMMARY).write_text(json.dumps(metrics))
    (report_dir / ABOUT_FILE).write_text(json.dumps(about))


def _write_bert(report_dir: Path) -> None:
    _write_finetune(report_dir, {"dev": 85.5, "test": 84.6}, {"metric": "accuracy", "model": "bert-base",
                                                              "data": "glue/mnli"})
    grid = [(layer, head) for layer in range(3) for head in range(4)]
    pd.DataFrame(
        [("encoder", lay, h, (h + 1) / 4) for lay, h in grid], columns=["kind", "layer", "head", "importance"]
    ).to_csv(report_dir / "importance.csv", index=False)
    ablation = pd.DataFrame(
        [("encoder", lay, h, 84.6, 0.0, 0.5) for lay, h in grid],
        columns=["kind", "layer", "head", "metric", "delta", "p_value"],
    )
    # Three significant heads, two of which improve the metric when removed.
    ablation.loc[0, ["delta", "p_value"]] = [-2.5, 0.001]
    ablation.loc[1, ["delta", "p_value"]] = [0.7, 0.01]
    ablation.loc[2, ["delta", "p_value"]] = [0.4, 0.04]
    ablation.to_csv(report_dir / "ablation.csv", index=False)
    pd.DataFrame(
        [("encoder", lay, 1, 83.0, -1.6) for lay in range(3)],
        columns=["kind", "layer", "best_head", "metric", "delta"],
    ).to_csv(report_dir / "one_head.csv", index=False)
    _write_curve(report_dir, {"importance": IMPORTANCE_TEST, "random": RANDOM_TEST})
    pd.DataFrame({"fraction_pruned": [0.3, 0.6], "metric_before": [83.0, 75.0], "metric_after": [84.0, 81.0]}).to_csv(
        report_dir / "recovery.csv", index=False
    )
    bench = []
    for bs in (1, 64):
        for f, speedup in ((0.0, 1.0), (0.5, 1.12 if bs == 64 else 1.01)):
            bench.append(
                {
                    "fraction_pruned": f,
                    "batch_size": bs,
                    "attn_implementation": "eager",
                    "examples_per_s": 100.0 * bs * speedup,
                    "speedup": speedup,
                    "speedup_q1": speedup * 0.98 if f else 1.0,
                    "speedup_q3": speedup * 1.01 if f else 1.0,
                    "speedup_min": speedup * 0.95 if f else 1.0,
                    "speedup_max": speedup * 1.03 if f else 1.0,
                    "ideal_speedup": 1.0 if f == 0 else 1.25,
                    "params": 1e8,
                    "device": "cpu",
                    "precision": "fp32",
                }
            )
    pd.DataFrame(bench).to_csv(report_dir / "benchmark.csv", index=False)


def _paper_section(md: str) -> str:
    return md.split("## Compared with the paper", 1)[1].split("\n## ", 1)[0]


def test_full_report(tmp_path: Path) -> None:
    _write_bert(tmp_path)
    html_path = build_report(tmp_path, "BERT on MNLI")

    assert html_path == tmp_path / "report.html"
    figures = {p.name for p in (tmp_path / "figures").glob("*.png")}
    assert figures == {"importance.png", "ablation.png", "pruning_curve.png", "recovery.png", "speedup.png"}
    md = (tmp_path / "report.md").read_text()
    for heading in (
        "# BERT on MNLI",
        "## Compared with the paper",
        "## Setup",
        "## Figures 3/4: iterative pruning",
        "## Head importance",
        "## Table 1: single-head ablation",
        "## Tables 2/3: one head per layer",
        "## Beyond the paper: fine-tuning after pruning",
        "## Table 4: inference speed",
    ):
        assert heading in md
    for name in figures:
        assert f"(figures/{name})" in md

    html = html_path.read_text()
    assert not EXTERNAL.search(html), "report.html must not load anything from the network"
    assert html.count('src="data:image/png;base64,') == len(figures)
    assert not list(tmp_path.glob(".*.tmp")), "temp files must be renamed away"

    paper = _paper_section(md)
    # (a) 30% is the last level within 1 point on test; dev has the same curve.
    assert "up to 30% of heads on test (84.6 -> 83.7)" in paper
    assert "the paper reports about 40% on MNLI" in paper
    # (b) 3 significant heads, 2 improving, vs none in the paper.
    assert "for 3 of 12 heads (2 improving)" in paper
    assert "0 of 144" in paper
    # (c) recovery +1.0 and +6.0 points -> +3.5 on average.
    assert "recovers +3.5 points on average" in paper
    # (d) 1.12x at batch 64 -> +12.0%, vs the paper's +17.5%.
    assert "+12.0% with eager attention" in paper and "+17.5%" in paper
    # (e) importance is better than random at every level from 20% to 80%.
    assert "beats random pruning" in paper and "at all 7 levels on test" in paper
    assert "cross-attention" not in paper  # BERT: no cross-attention sentence

    # Table 4 comparison row for batch 64.
    assert "| eager | 64 | 6400.0 | 7168.0 | +12.0% [+6.4, +15.4] | +25.0% | 124.7 -> 146.6 | +17.5% |" in md
    assert "Against the work no pruning removes" not in md  # no floor model was timed


def test_table4_sets_each_pruned_model_beside_its_amdahl_estimate_when_the_benchmark_timed_a_floor(
        tmp_path: Path) -> None:
    _write_bert(tmp_path)
    bench = pd.read_csv(tmp_path / "benchmark.csv")
    bench["floor_share"] = bench["batch_size"].map({1: 0.14, 64: 0.07})
    # The 50% model's estimate at batch 1 is below its measured speedup: an estimate, not a bound.
    bench["amdahl_speedup"] = [1.0, 0.99, 1.0, 1.2]
    bench.to_csv(tmp_path / "benchmark.csv", index=False)
    build_report(tmp_path, "BERT on MNLI")
    md = (tmp_path / "report.md").read_text()
    section = md.split("### Against the work no pruning removes", 1)[1].split("\n#", 1)[0]
    assert "an estimate, not a bound" in section
    assert "| eager | 50% | 1 | 1.01 [0.96, 1.04] | 1.25 | 0.808 | 14% | 0.99 | 1.02 |" in section
    # 1.12 / 1.25 is 0.896 of the ideal: under a 0.9 target, so not rounded up to 0.90.
    assert "| eager | 50% | 64 | 1.12 [1.06, 1.15] | 1.25 | 0.896 | 7% | 1.20 | 0.93 |" in section
    assert "| 0% |" not in section  # the reference is not a row


def test_every_speed_table_lists_fp32_first_whatever_order_the_benchmark_wrote_its_precisions_in(
        tmp_path: Path) -> None:
    _write_bert(tmp_path)
    fp32 = pd.read_csv(tmp_path / "benchmark.csv").assign(floor_share=0.1, amdahl_speedup=1.1)
    pd.concat([fp32.assign(precision="bf16"), fp32]).to_csv(tmp_path / "benchmark.csv", index=False)
    build_report(tmp_path, "BERT on MNLI")
    md = (tmp_path / "report.md").read_text()
    amdahl = md.split("### Against the work no pruning removes", 1)[1].split("\n#", 1)[0]
    paper = md.split("### Compared with the paper's Table 4", 1)[1].split("\n#", 1)[0]
    for section in (amdahl, paper):
        precisions = [line.split(" | ")[0].strip("| ") for line in section.splitlines()
                      if line.startswith(("| fp32 ", "| bf16 "))]
        assert precisions == ["fp32"] * 2 + ["bf16"] * 2, section


def test_prunable_fraction_stops_at_first_drop() -> None:
    curve = pd.DataFrame(
        {"method": "importance", "split": "test", "fraction_pruned": FRACTIONS, "metric": IMPORTANCE_TEST}
    )
    frac, metric, base = prunable_fraction(curve, "importance", "test", "accuracy")
    assert (frac, metric, base) == (0.3, 83.7, 84.6)
    # Exactly 1 point lost still counts as "within 1 point".
    curve.loc[4, "metric"] = 83.6
    assert prunable_fraction(curve, "importance", "test", "accuracy")[0] == pytest.approx(0.5)
    assert prunable_fraction(curve[curve["fraction_pruned"] > 0], "importance", "test", "accuracy") is None


def test_importance_not_always_better_than_random(tmp_path: Path) -> None:
    worse = list(RANDOM_TEST)
    worse[FRACTIONS.index(0.4)] = 83.0  # random beats importance (82.0) at 40%
    _write_curve(tmp_path, {"importance": IMPORTANCE_TEST, "random": worse}, splits=("test",))
    build_report(tmp_path, "t")
    paper = _paper_section((tmp_path / "report.md").read_text())
    assert "does not always beat random" in paper and "at 6 of 7 levels on test (not at 40%)" in paper


def test_missing_files_are_skipped(tmp_path: Path) -> None:
    _write_curve(tmp_path, {"importance": IMPORTANCE_TEST}, splits=("dev",))
    build_report(tmp_path, "only a curve")
    md = (tmp_path / "report.md").read_text()
    assert "## Figures 3/4: iterative pruning" in md and "up to 30% of heads on dev" in md
    for absent in ("## Setup", "## Head importance", "## Table 1", "## Tables 2/3", "## Table 4", "fine-tuning after"):
        assert absent not in md
    assert {p.name for p in (tmp_path / "figures").glob("*.png")} == {"pruning_curve.png"}


def test_the_report_is_titled_after_the_model_and_data_that_about_json_names(tmp_path: Path) -> None:
    _write_bert(tmp_path)
    build_report(tmp_path)
    assert (tmp_path / "report.md").read_text().startswith("# Head pruning: bert-base on glue/mnli\n")


def test_a_report_folder_written_before_about_json_reads_the_descriptions_from_finetune_json(tmp_path: Path) -> None:
    (tmp_path / FINETUNE_SUMMARY).write_text(json.dumps({"metric": "accuracy", "dev": 85.5, "test": 84.6,
                                                         "model": "bert-base", "data": "glue/mnli"}))
    build_report(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# Head pruning: bert-base on glue/mnli\n") and "Unpruned test accuracy: 84.6" in md


def test_the_report_stage_imports_neither_torch_nor_transformers() -> None:
    """It renders tables only, so it starts in seconds (3.5 s here, against 12 s with torch and transformers)."""
    probe = "import sys, stages.report; print(sorted({'torch', 'transformers', 'datasets'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_empty_dir_and_stale_figures(tmp_path: Path) -> None:
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "ablation.png").write_bytes(b"old")  # from an earlier run with more data
    build_report(tmp_path, "nothing yet")
    assert "No results found" in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "figures" / "ablation.png").exists()


def test_malformed_csv_is_an_error(tmp_path: Path) -> None:
    pd.DataFrame({"method": ["importance"], "metric": [1.0]}).to_csv(tmp_path / "pruning_curve.csv", index=False)
    with pytest.raises(ValueError, match="missing columns"):
        build_report(tmp_path, "t")


def _write_mt(report_dir: Path) -> None:
    _write_finetune(report_dir, {"dev": 27.0, "test": 26.0}, {"metric": "bleu", "model": "transformer",
                                                              "data": "wmt14 en-de"})
    pd.DataFrame(
        [(k, lay, h, 26.0, 0.0, 0.9) for k in KINDS for lay in range(2) for h in range(2)],
        columns=["kind", "layer", "head", "metric", "delta", "p_value"],
    ).to_csv(report_dir / "ablation.csv", index=False)
    flat = [26.0 - 2 * f for f in FRACTIONS]
    cross = [26.0 - 2 * f if f <= 0.6 else 10.0 for f in FRACTIONS]
    _write_curve(
        report_dir,
        {
            IMPORTANCE: flat,
            kind_method("encoder"): flat,
            kind_method("decoder"): flat,
            kind_method("cross"): cross,
            checkpoint_method(1000): [x - 5 for x in flat],
        },
        metric="bleu",
    )


def test_mt_report_is_kind_aware(tmp_path: Path) -> None:
    _write_mt(tmp_path)
    build_report(tmp_path, "MT")
    md = (tmp_path / "report.md").read_text()
    paper = _paper_section(md)
    assert "about 20% on WMT" in paper and "1 BLEU point" in paper
    assert "8 of 96" in paper
    assert "Pruning 80% of cross-attention heads costs 16.0 BLEU points on test" in paper
    assert "as in the paper" in paper
    figures = {p.name for p in (tmp_path / "figures").glob("*.png")}
    assert {
        "pruning_curve.png",
        "pruning_by_kind.png",
        "pruning_during_training.png",
        "ablation.png",
    } <= figures


def _headings(md: str) -> list[str]:
    return [line.removeprefix("## ") for line in md.splitlines() if line.startswith("## ")]


def test_headings_name_the_papers_artefacts(tmp_path: Path) -> None:
    (tmp_path / "bert").mkdir()
    _write_bert(tmp_path / "bert")
    build_report(tmp_path / "bert", "BERT")
    bert = _headings((tmp_path / "bert" / "report.md").read_text())
    for artefact in ("Table 1:", "Tables 2/3:", "Figures 3/4:", "Table 4:"):
        assert any(h.startswith(artefact) for h in bert), artefact
    # Figures 5 and 6 are the MT experiments' (attention kinds, training checkpoints).
    assert not any(h.startswith(("Figure 5", "Figure 6")) for h in bert)
    assert "Beyond the paper: fine-tuning after pruning" in bert

    (tmp_path / "mt").mkdir()
    _write_mt(tmp_path / "mt")
    build_report(tmp_path / "mt", "MT")
    mt = _headings((tmp_path / "mt" / "report.md").read_text())
    for artefact in ("Table 1:", "Figures 3/4:", "Figure 5:", "Figure 6:"):
        assert any(h.startswith(artefact) for h in mt), artefact
    # Each figure sits under its own heading, in the paper's order.
    figures = [h for h in mt if h.startswith("Figure")]
    assert figures == ["Figures 3/4: iterative pruning", "Figure 5: pruning by attention kind",
                       "Figure 6: importance during training"]


def test_figures_are_deterministic(tmp_path: Path) -> None:
    _write_curve(tmp_path, {"importance": IMPORTANCE_TEST, "random": RANDOM_TEST})
    build_report(tmp_path, "t")
    first = (tmp_path / "figures" / "pruning_curve.png").read_bytes()
    build_report(tmp_path, "t")
    assert (tmp_path / "figures" / "pruning_curve.png").read_bytes() == first


# --- offline DVC plots template ---------------------------------------------------------------------


def test_template_assembly_keeps_dvc_placeholders() -> None:
    html = plots_template.build_template({"a": "var a = '</script>';\n//# sourceMappingURL=a.min.js.map"}, "a@1")
    assert html.count("{plot_divs}") == 1 and "{refresh_tag}" in html
    assert "{scripts}" not in html  # DVC would put its CDN <script src> tags there
    assert "<\\/script>" in html and "sourceMappingURL" not in html
    with pytest.raises(ValueError, match="placeholder"):
        plots_template.build_template({"a": "x = '{plot_divs}'"}, "a@1")


def test_template_rejects_tampered_tarball(tmp_path: Path) -> None:
    tarball = tmp_path / "vega-5.33.1.tgz"
    tarball.write_bytes(b"not the pinned tarball")
    with pytest.raises(ValueError, match="integrity"):
        plots_template.read_build(tarball, plots_template.PACKAGES[0])


def test_shipped_template_is_offline() -> None:
    path = plots_template.DEFAULT_OUT
    if not path.is_file():
        pytest.skip("reports/plots_template.html not generated")
    html = path.read_text(encoding="utf-8")
    assert html.count("{plot_divs}") == 1 and "{scripts}" not in html
    assert not re.search(r"<script[^>]*\ssrc\s*=", html, re.I)
    assert not EXTERNAL.search(html)
    for package in plots_template.PACKAGES:
        assert f"{package.name}@{package.version}" in html


def test_an_llm_report_sets_kv_cache_savings_and_the_anchor_tools_beside_this_run(tmp_path: Path) -> None:
    _write_curve(tmp_path, {IMPORTANCE: IMPORTANCE_TEST, "magnitude": RANDOM_TEST, "activation": RANDOM_TEST})
    pd.DataFrame([{"fraction_removed": 0.5, "layer": layer, "kv_heads": 1, STOCK: True, NOT_STOCK_BECAUSE: ""}
                  for layer in range(6)], columns=TABLE_COLUMNS[KV_GROUPS_TABLE]).to_csv(tmp_path / KV_GROUPS_TABLE,
                                                                                       index=False)
    rows = []
    for model, kv, ideal_kv, ideal_flops in ((UNPRUNED_MODEL, 3072, 1.0, 1.0), (kv_groups_label(0.5), 1536, 2.0, 1.16)):
        for phase in ("prefill", "decode"):
            for batch in (1, 32):
                rows.append(dict(model=model, batch_size=batch, phase=phase, tokens_per_s=1000.0 * ideal_flops,
                                 speedup=ideal_flops, speedup_q1=ideal_flops, speedup_q3=ideal_flops,
                                 speedup_min=ideal_flops, speedup_max=ideal_flops,
                                 ideal_speedup_flops=ideal_flops, ideal_speedup_kv=ideal_kv,
                                 kv_bytes_per_token=kv, peak_memory_mb=20.0, params=1_000_000, device="cpu",
                                 precision="fp32"))
    pd.DataFrame(rows).to_csv(tmp_path / "llm_benchmark.csv", index=False)
    build_report(tmp_path, "LLM")
    md = (tmp_path / "report.md").read_text()
    assert "# Beyond the paper: serving a pruned LLM (KV cache and decoding speed)" in md
    assert "576,501" in md and "its criterion gives test metric 76.0 and the paper's importance 84.0" in md
    assert "a stock Hugging Face folder" in md and "1536 bytes per token, 2.00x fewer than unpruned" in md
    assert "| 50% of KV groups | 1536 | 50% |" in md

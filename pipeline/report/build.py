"""Render the experiment report: figures (PNG), report.md and a self-contained report.html.

Every input file is optional; a section whose file is missing (or empty) is skipped. Metrics are in
percent (0-100) or BLEU points, so "1 point" is 1.0 everywhere.

Inputs in report_dir (columns):
    finetune.json       {"metric", "dev", "test", "model", "data", optional "data_attribution"}
    importance.csv      kind, layer, head, importance            (per-layer normalised)
    ablation.csv        kind, layer, head, metric, delta, p_value (one head masked; delta = masked - full)
    one_head.csv        kind, layer, best_head, metric, delta    (only one head kept in a layer)
    pruning_curve.csv   method, split, fraction_pruned, heads_pruned, metric [, metric_std]
                        [, fraction_flops_removed]
    recovery.csv        fraction_pruned, metric_before, metric_after
    benchmark.csv       fraction_pruned, batch_size, attn_implementation, examples_per_s, speedup,
                        ideal_speedup, params [, weights_mb, activations_mb, peak_memory_mb]
                        (speedup = throughput ratio pruned / unpruned, 1.0 = no change)
    budgeted_curve.csv  method, split, budget_removed, fraction_flops_removed, heads_pruned,
                        neurons_pruned, metric [, seconds]   (the paper's order and Kwon-style budgets)
    benchmark_budgeted.csv  budget_removed, batch_size, attn_implementation, examples_per_s, speedup,
                        ideal_speedup

CLI:  python -m pipeline.report.build <report_dir> --title "..."
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless; must precede the pyplot import

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pipeline.files.atomic import write_bytes  # noqa: E402
from pipeline.methods.pruning import prunable_fraction  # noqa: E402

# Reference numbers from Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?".
# Kept in one place so the BERT and the MT experiments share the renderer.
PAPER: dict = {
    # Figures 3-4: share of all heads prunable by importance before the metric drops noticeably.
    "prunable": {"MNLI": "about 40%", "SST-2": "50-60%", "WMT": "about 20%"},
    # Single-head ablation: heads whose removal changes the metric significantly (p < 0.05).
    "single_head": {
        "bert": {"significant": 0, "of": 144, "improving": 0, "where": "BERT on MNLI"},
        "mt": {"significant": 8, "of": 96, "improving": 4, "where": "the WMT encoder self-attention"},
    },
    # Figure 5: pruning encoder-decoder (cross) attention collapses BLEU beyond this share of heads.
    "cross_collapse_above": 0.6,
    # Table 4: BERT-base, MNLI, 50% of heads pruned, GTX 1080Ti; examples/s (unpruned, pruned, % gain).
    "speedup": {
        "fraction_pruned": 0.5,
        "table": {
            1: (17.0, 17.3, 1.9),
            4: (67.3, 69.1, 2.7),
            16: (114.0, 134.0, 17.5),
            64: (124.7, 146.6, 17.5),
        },
        "headline_batch": 64,
    },
}

# Kwon, Kim, Mahoney, Hassoun, Keutzer & Gholami (2022), "A Fast Post-Training Pruning Framework for
# Transformers": heads and FFN neurons under a FLOP or latency budget, no retraining (their abstract).
KWON: dict = {"flops_removed": 0.4, "loss": "under 1 point", "latency_speedup": 1.56, "minutes": 3,
              "where": "BERT-base on GLUE and SQuAD", "hardware": "one GPU"}

TOLERANCE = 1.0  # points lost that still count as "no real loss" in the prunable-fraction sentence
ALPHA = 0.05  # significance level used for the single-head ablation
SPLIT_ORDER = ["dev", "test"]
KIND_ORDER = ["encoder", "decoder", "cross"]
KIND_LABEL = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention",
}

REQUIRED = {
    "importance.csv": ["kind", "layer", "head", "importance"],
    "ablation.csv": ["kind", "layer", "head", "metric", "delta", "p_value"],
    "one_head.csv": ["kind", "layer", "best_head", "metric", "delta"],
    "pruning_curve.csv": ["method", "split", "fraction_pruned", "metric"],
    "recovery.csv": ["fraction_pruned", "metric_before", "metric_after"],
    "benchmark.csv": [
        "fraction_pruned",
        "batch_size",
        "attn_implementation",
        "examples_per_s",
        "speedup",
        "ideal_speedup",
    ],
    "budgeted_curve.csv": ["method", "split", "budget_removed", "fraction_flops_removed", "metric"],
    "benchmark_budgeted.csv": ["budget_removed", "batch_size", "attn_implementation", "speedup", "ideal_speedup"],
}
BUDGETED_ORDER = ["paper", "budgeted-heads", "budgeted", "budgeted-tuned"]


# --------------------------------------------------------------------------------------------------
# Small helpers


def _pct(fraction: float) -> str:
    """0.3 -> '30%', 0.125 -> '12.5%'."""
    return f"{100 * fraction:.1f}".removesuffix(".0") + "%"


def _num(x: float, digits: int = 1) -> str:
    return f"{x:.{digits}f}"


def _signed(x: float, digits: int = 1) -> str:
    return f"{x:+.{digits}f}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _kinds(df: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(df["kind"]))
    return [k for k in KIND_ORDER if k in present] + [k for k in present if k not in KIND_ORDER]


def _splits(df: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(df["split"]))
    return [s for s in SPLIT_ORDER if s in present] + sorted(s for s in present if s not in SPLIT_ORDER)


def _at(df: pd.DataFrame, column: str, value: float) -> pd.DataFrame:
    """Rows whose float column equals value (fractions come from CSV, so compare with a tolerance)."""
    return df[np.isclose(df[column].astype(float), value, atol=1e-6)]


# --------------------------------------------------------------------------------------------------
# Loading


def _read_csv(report_dir: Path, name: str) -> pd.DataFrame | None:
    path = report_dir / name
    if not path.is_file():
        return None
    df = pd.read_csv(path)
    if df.empty:
        return None
    missing = [c for c in REQUIRED[name] if c not in df.columns]
    if missing:
        # A malformed file is a bug upstream; a silently skipped section would hide it.
        raise ValueError(f"{path}: missing columns {missing}")
    return df


@dataclass
class Inputs:
    finetune: dict | None = None
    importance: pd.DataFrame | None = None
    ablation: pd.DataFrame | None = None
    one_head: pd.DataFrame | None = None
    curve: pd.DataFrame | None = None
    recovery: pd.DataFrame | None = None
    benchmark: pd.DataFrame | None = None
    prune: dict | None = None
    budgeted: pd.DataFrame | None = None
    benchmark_budgeted: pd.DataFrame | None = None

    @classmethod
    def load(cls, report_dir: Path) -> Inputs:
        def read_json(name: str) -> dict | None:
            path = report_dir / name
            return json.loads(path.read_text()) if path.is_file() else None

        return cls(
            finetune=read_json("finetune.json"),
            prune=read_json("prune.json"),
            importance=_read_csv(report_dir, "importance.csv"),
            ablation=_read_csv(report_dir, "ablation.csv"),
            one_head=_read_csv(report_dir, "one_head.csv"),
            curve=_read_csv(report_dir, "pruning_curve.csv"),
            recovery=_read_csv(report_dir, "recovery.csv"),
            benchmark=_read_csv(report_dir, "benchmark.csv"),
            budgeted=_read_csv(report_dir, "budgeted_curve.csv"),
            benchmark_budgeted=_read_csv(report_dir, "benchmark_budgeted.csv"),
        )

    @property
    def is_bleu(self) -> bool:
        return str((self.finetune or {}).get("metric", "")).lower() == "bleu"

    @property
    def metric_name(self) -> str:
        return "BLEU" if self.is_bleu else str((self.finetune or {}).get("metric", "metric"))

    @property
    def metric_label(self) -> str:
        """Axis label with unit."""
        return "BLEU" if self.is_bleu else f"{self.metric_name} (%)"

    @property
    def points(self) -> str:
        return "BLEU points" if self.is_bleu else "points"

    @property
    def point(self) -> str:
        return "BLEU point" if self.is_bleu else "point"

    @property
    def is_mt(self) -> bool:
        """Encoder-decoder experiment: decides which of the paper's numbers we compare against."""
        kinds: set[str] = set()
        for df in (self.importance, self.ablation, self.one_head):
            if df is not None:
                kinds |= set(df["kind"])
        methods = set(self.curve["method"]) if self.curve is not None else set()
        return self.is_bleu or bool(kinds & {"decoder", "cross"}) or any(m.startswith("importance-") for m in methods)

    @property
    def task(self) -> str | None:
        """Which of the paper's tasks this run corresponds to, from finetune.json's "data"."""
        data = str((self.finetune or {}).get("data", "")).lower()
        if "mnli" in data:
            return "MNLI"
        if "sst" in data:
            return "SST-2"
        if "wmt" in data or self.is_mt:
            return "WMT"
        return None


# --------------------------------------------------------------------------------------------------
# Document model: a list of blocks rendered twice, to Markdown and to HTML, so both say the same.


@dataclass
class Figure:
    name: str  # file name under figures/
    png: bytes
    caption: str


@dataclass
class Doc:
    blocks: list[tuple] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def ul(self, items: list[str]) -> None:
        if items:
            self.blocks.append(("ul", items))

    def table(self, df: pd.DataFrame) -> None:
        """df holds display strings already (formatting is the caller's job)."""
        self.blocks.append(("table", df))

    def figure(self, fig: plt.Figure, name: str, caption: str) -> None:
        buf = io.BytesIO()
        # No "Software" metadata: identical inputs give byte-identical PNGs (stable DVC hashes).
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
        plt.close(fig)
        item = Figure(name, buf.getvalue(), caption[:1].upper() + caption[1:])
        self.figures.append(item)
        self.blocks.append(("fig", item))


def _md_cell(x: object) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _to_markdown(doc: Doc, title: str) -> str:
    out = [f"# {title}", ""]
    for block in doc.blocks:
        kind = block[0]
        if kind == "h":
            out += ["#" * (block[1] + 1) + " " + block[2], ""]
        elif kind == "p":
            out += [block[1], ""]
        elif kind == "ul":
            out += [f"- {item}" for item in block[1]] + [""]
        elif kind == "table":
            df = block[1]
            out.append("| " + " | ".join(_md_cell(c) for c in df.columns) + " |")
            out.append("|" + "|".join(" --- " for _ in df.columns) + "|")
            out += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
            out.append("")
        elif kind == "fig":
            out += [f"![{block[1].caption}](figures/{block[1].name})", "", f"*{block[1].caption}*", ""]
    return "\n".join(out)


CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1100px;
       margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #ddd; padding-bottom: .3em; }
h2 { border-bottom: 1px solid #eee; padding-bottom: .2em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .8em 0; font-size: .92em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: right; }
th { background: #f3f3f3; }
td:first-child, th:first-child { text-align: left; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: .9em; }
"""


def _to_html(doc: Doc, title: str) -> str:
    esc = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        f"<style>{CSS}</style>",
        "</head><body>",
        f"<h1>{esc(title)}</h1>",
    ]
    for block in doc.blocks:
        kind = block[0]
        if kind == "h":
            level = block[1] + 1
            out.append(f"<h{level}>{esc(block[2])}</h{level}>")
        elif kind == "p":
            out.append(f"<p>{esc(block[1])}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{esc(item)}</li>" for item in block[1]) + "</ul>")
        elif kind == "table":
            df = block[1]
            head = "".join(f"<th>{esc(str(c))}</th>" for c in df.columns)
            rows = "".join(
                "<tr>" + "".join(f"<td>{esc(str(v))}</td>" for v in row) + "</tr>" for row in df.itertuples(index=False)
            )
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif kind == "fig":
            # Inline the PNG so the page works offline and can be mailed or archived as one file.
            data = base64.b64encode(block[1].png).decode("ascii")
            cap = esc(block[1].caption)
            out.append(
                f'<figure><img alt="{cap}" src="data:image/png;base64,{data}"><figcaption>{cap}</figcaption></figure>'
            )
    out.append("</body></html>")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------
# Sections


def _section_setup(doc: Doc, inp: Inputs) -> None:
    ft = inp.finetune
    if not ft:
        return
    doc.h(1, "Setup")
    items = [f"Model: {ft['model']}" if "model" in ft else "", f"Data: {ft['data']}" if "data" in ft else ""]
    for split in ("dev", "test"):
        if split in ft:
            items.append(f"Unpruned {split} {inp.metric_name}: {_num(float(ft[split]))}")
    doc.ul([i for i in items if i])
    if ft.get("data_attribution"):
        doc.p(f"Data attribution: {ft['data_attribution']}")


def _heatmaps(
    frames: dict[str, pd.DataFrame],
    value: str,
    cbar_label: str,
    title: str,
    diverging: bool,
    marks: dict[str, pd.DataFrame] | None = None,
) -> plt.Figure:
    """One layer x head heatmap per kind, side by side, sharing one colour scale."""
    kinds = list(frames)
    grids = {k: df.pivot_table(index="layer", columns="head", values=value, aggfunc="mean") for k, df in frames.items()}
    n_heads = max(g.shape[1] for g in grids.values())
    n_layers = max(g.shape[0] for g in grids.values())
    width = min(6.0, 1.0 + 0.4 * n_heads)
    fig, axes = plt.subplots(
        1,
        len(kinds),
        figsize=(width * len(kinds) + 0.6, 0.9 + 0.38 * n_layers),
        squeeze=False,
        layout="constrained",
    )
    values = np.concatenate([g.to_numpy().ravel() for g in grids.values()])
    values = values[np.isfinite(values)]
    if diverging:
        # Symmetric around 0 so white means "no change"; red = worse after removal, blue = better.
        vmax = float(np.max(np.abs(values))) if values.size else 0.0
        vmax = vmax or 1.0
        vmin, cmap = -vmax, "RdBu"
    else:
        vmin, vmax, cmap = float(values.min()), float(values.max()), "viridis"
    image = None
    for ax, kind in zip(axes[0], kinds, strict=True):
        grid = grids[kind]
        image = ax.imshow(grid.to_numpy(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns], fontsize=7)
        ax.set_yticks(range(grid.shape[0]), [str(r) for r in grid.index], fontsize=7)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(KIND_LABEL.get(kind, kind) if len(kinds) > 1 else title, fontsize=10)
        if marks is not None and kind in marks:
            rows, cols = list(grid.index), list(grid.columns)
            for r in marks[kind].itertuples(index=False):
                y, x = rows.index(r.layer), cols.index(r.head)
                ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="black", lw=1.5))
                ax.text(x, y, "*", ha="center", va="center", fontsize=9, color="black")
    if len(kinds) > 1:
        fig.suptitle(title)
    fig.colorbar(image, ax=axes[0].tolist(), label=cbar_label, shrink=0.9)
    return fig


def _section_importance(doc: Doc, inp: Inputs) -> None:
    df = inp.importance
    if df is None:
        return
    doc.h(1, "Head importance")
    frames = {k: df[df["kind"] == k] for k in _kinds(df)}
    fig = _heatmaps(
        frames, "importance", "importance (normalised per layer)", "Head importance scores", diverging=False
    )
    doc.figure(fig, "importance.png", "Head importance (proxy score, normalised within each layer), layer x head.")


def _section_ablation(doc: Doc, inp: Inputs) -> None:
    df = inp.ablation
    if df is None:
        return
    doc.h(1, "Single-head ablation")
    sig = df[df["p_value"] < ALPHA]
    frames = {k: df[df["kind"] == k] for k in _kinds(df)}
    marks = {k: sig[sig["kind"] == k] for k in frames}
    fig = _heatmaps(
        frames,
        "delta",
        f"change in {inp.metric_label} when the head is removed",
        "Effect of removing one head",
        diverging=True,
        marks=marks,
    )
    doc.figure(
        fig,
        "ablation.png",
        f"Change in {inp.metric_name} when a single head is masked (red: worse, blue: better); "
        f"boxed * = significant at p < {ALPHA}.",
    )
    improving = int((sig["delta"] > 0).sum())
    on = f" on {int(df['examples'].iloc[0])} examples" if "examples" in df else ""
    doc.p(
        f"Evaluated{on}: {len(sig)} of {len(df)} single-head removals change {inp.metric_name} significantly "
        f"(p < {ALPHA}, uncorrected), {improving} of them for the better. With {len(df)} tests about "
        f"{ALPHA * len(df):.0f} would be expected at this level by chance alone."
    )

    def fmt(rows: pd.DataFrame) -> pd.DataFrame:
        out = pd.DataFrame(
            {
                "kind": rows["kind"],
                "layer": rows["layer"],
                "head": rows["head"],
                inp.metric_name: rows["metric"].map(_num),
                f"delta ({inp.points})": rows["delta"].map(_signed),
                "p-value": rows["p_value"].map(lambda p: f"{p:.3g}"),
            }
        )
        return out if len(_kinds(df)) > 1 else out.drop(columns="kind")

    n = min(5, len(df))
    doc.h(2, "Most harmful removals")
    doc.table(fmt(df.nsmallest(n, "delta")))
    doc.h(2, "Most helpful removals")
    doc.table(fmt(df.nlargest(n, "delta")))


def _section_one_head(doc: Doc, inp: Inputs) -> None:
    df = inp.one_head
    if df is None:
        return
    doc.h(1, "Keeping only one head per layer")
    kinds = _kinds(df)
    df = df.assign(_rank=df["kind"].map(kinds.index)).sort_values(["_rank", "layer"])
    worst = df.loc[df["delta"].idxmin()]
    where = f"{KIND_LABEL.get(worst['kind'], worst['kind'])} layer {worst['layer']}"
    doc.p(
        f"The worst layer to reduce to its best single head is {where} ({_signed(worst['delta'])} "
        f"{inp.points}); the median change over layers is {_signed(df['delta'].median())} {inp.points}."
    )
    table = pd.DataFrame(
        {
            "kind": df["kind"],
            "layer": df["layer"],
            "best head": df["best_head"],
            inp.metric_name: df["metric"].map(_num),
            f"delta ({inp.points})": df["delta"].map(_signed),
        }
    )
    doc.table(table if df["kind"].nunique() > 1 else table.drop(columns="kind"))


def _method_groups(curve: pd.DataFrame) -> list[tuple[str, str, list[str]]]:
    """Split methods into readable figures: main comparison, per attention kind (MT), training dynamics."""
    methods = list(dict.fromkeys(curve["method"]))
    per_kind = [m for m in methods if m.startswith("importance-")]
    dynamics = sorted((m for m in methods if m.startswith("checkpoint-")), key=_checkpoint_step)
    main = [m for m in methods if m not in per_kind and m not in dynamics]
    groups = [("pruning_curve", "Pruning heads in order of importance vs. baselines", main)]
    if per_kind:
        groups.append(
            (
                "pruning_by_kind",
                "Pruning one attention kind at a time",
                per_kind + (["importance"] if "importance" in methods else []),
            )
        )
    if dynamics:
        groups.append(("pruning_during_training", "Pruning at different training checkpoints", dynamics))
    return [g for g in groups if g[2]]


def _checkpoint_step(method: str) -> float:
    try:
        return float(method.rsplit("-", 1)[-1])
    except ValueError:
        return float("inf")


def _style(method: str, index: int, n_dynamics: int = 0) -> dict:
    if method == "random":
        return {"color": "0.45", "ls": "--", "marker": "s"}
    if method.startswith("checkpoint-") and n_dynamics:
        # Early -> late checkpoint as dark -> light; stop before viridis' pale yellow end.
        return {"color": plt.cm.viridis(0.85 * index / max(1, n_dynamics - 1)), "ls": "-", "marker": "."}
    return {"color": f"C{index % 10}", "ls": "-", "marker": "o"}


def _curve_figure(inp: Inputs, curve: pd.DataFrame, methods: list[str], x: str, xlabel: str, title: str) -> plt.Figure:
    splits = _splits(curve)
    fig, axes = plt.subplots(
        1, len(splits), figsize=(6.0 * len(splits), 4.3), squeeze=False, sharey=True, layout="constrained"
    )
    n_dyn = sum(m.startswith("checkpoint-") for m in methods)
    for ax, split in zip(axes[0], splits, strict=True):
        part = curve[curve["split"] == split]
        for i, method in enumerate(methods):
            rows = part[part["method"] == method].dropna(subset=[x]).sort_values(x)
            if rows.empty:
                continue
            style = _style(method, i, n_dyn)
            ax.plot(100 * rows[x], rows["metric"], label=method, ms=3.5, lw=1.5, **style)
            if "metric_std" in rows and rows["metric_std"].notna().any():
                std = rows["metric_std"].fillna(0)
                ax.fill_between(
                    100 * rows[x],
                    rows["metric"] - std,
                    rows["metric"] + std,
                    color=style["color"],
                    alpha=0.15,
                    lw=0,
                )
        # Checkpoint curves start from different models, so a shared "unpruned" line would mislead.
        base = None if n_dyn else _baseline(part[part["method"].isin(methods)])
        if base is not None:
            ax.axhline(base - TOLERANCE, color="0.6", lw=0.8, ls=":", label=f"unpruned - {TOLERANCE:g} {inp.point}")
        ax.set_title(f"{split} split")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(inp.metric_label)
        if x == "fraction_pruned":
            ax.set_xlim(-2, 102)  # same axes as the paper's figures; FLOPs removed stays autoscaled
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="lower left")
    fig.suptitle(title)
    return fig


def _baseline(part: pd.DataFrame) -> float | None:
    """Unpruned metric for one split: the fraction-0 rows (all methods agree there; take the mean)."""
    rows = _at(part, "fraction_pruned", 0.0)
    return float(rows["metric"].mean()) if not rows.empty else None


def _section_curves(doc: Doc, inp: Inputs) -> None:
    curve = inp.curve
    if curve is None:
        return
    doc.h(1, "Pruning curves")
    if "examples" in curve:
        sizes = curve.groupby("split", sort=False)["examples"].first()
        doc.p("Every level is evaluated on " + " and ".join(f"{int(n)} {s}" for s, n in sizes.items())
              + " examples.")
    for name, title, methods in _method_groups(curve):
        fig = _curve_figure(inp, curve, methods, "fraction_pruned", "heads pruned (% of all heads)", title)
        doc.figure(fig, f"{name}.png", f"{title}: {inp.metric_name} vs. share of heads pruned.")
    if "fraction_flops_removed" in curve and curve["fraction_flops_removed"].notna().any():
        main = _method_groups(curve)[0][2]
        fig = _curve_figure(
            inp,
            curve,
            main,
            "fraction_flops_removed",
            "inference FLOPs removed (%)",
            "Accuracy vs. compute removed",
        )
        doc.figure(fig, "pruning_curve_flops.png", f"{inp.metric_name} vs. share of inference FLOPs removed.")


def _budgeted_at(curve: pd.DataFrame, split: str, method: str, level: float) -> float | None:
    rows = _at(curve[(curve["split"] == split) & (curve["method"] == method)], "budget_removed", level)
    return float(rows["metric"].iloc[0]) if not rows.empty else None


def _section_budgeted(doc: Doc, inp: Inputs) -> None:
    curve = inp.budgeted
    if curve is None:
        return
    methods = [m for m in BUDGETED_ORDER if m in set(curve["method"])]
    splits = _splits(curve)
    cost = _budget_name(inp)
    doc.h(1, f"Beyond the paper: heads and FFN neurons under a {cost} budget")
    doc.p("The paper prunes heads only, ranks them by |gradient| and never retrains. Kwon et al. (2022) prune "
          "heads and FFN neurons jointly under a FLOP or latency budget, also without retraining: choose by "
          "Fisher importance, rearrange within each layer, then tune the kept units' scales by least squares. "
          f"Here each method removes the same share of the model's {cost}; `paper` removes heads in the paper's "
          "importance order until the model fits. `budgeted-heads` is Fisher on heads only, `budgeted` adds FFN "
          "neurons, `budgeted-tuned` adds the tuning.")
    fig, axes = plt.subplots(1, len(splits), figsize=(6.0 * len(splits), 4.3), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, split in zip(axes[0], splits, strict=True):
        part = curve[curve["split"] == split]
        for i, method in enumerate(methods):
            rows = part[part["method"] == method].sort_values("budget_removed")
            ax.plot(100 * rows["budget_removed"], rows["metric"], label=method, ms=3.5, lw=1.5, **_style(method, i))
        base = _budgeted_at(curve, split, methods[0], 0.0)
        if base is not None:
            ax.axhline(base - TOLERANCE, color="0.6", lw=0.8, ls=":", label=f"unpruned - {TOLERANCE:g} {inp.point}")
        ax.set_title(f"{split} split")
        ax.set_xlabel(f"{cost} removed (% of the model's)")
        ax.set_ylabel(inp.metric_label)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="lower left")
    fig.suptitle(f"Accuracy at equal {cost}")
    doc.figure(fig, "budgeted.png", f"{inp.metric_name} of each method at the same share of {cost} removed.")

    split = "test" if "test" in splits else splits[-1]
    levels = sorted(set(curve["budget_removed"]) - {0.0})
    table = {f"{cost} removed": [_pct(lv) for lv in levels]}
    for method in methods:
        table[method] = [_num(v) if (v := _budgeted_at(curve, split, method, lv)) is not None else "out of reach"
                         for lv in levels]
    if {"paper", "budgeted-tuned"} <= set(methods):
        margins = []
        for lv in levels:
            ours, paper = _budgeted_at(curve, split, "budgeted-tuned", lv), _budgeted_at(curve, split, "paper", lv)
            margins.append(_signed(ours - paper) if ours is not None and paper is not None else "")
        table["budgeted-tuned - paper"] = margins
    examples = int(curve[curve["split"] == split]["examples"].iloc[0]) if "examples" in curve else None
    doc.h(2, f"{inp.metric_name} on {split}" + (f" ({examples} examples)" if examples else ""))
    doc.table(pd.DataFrame(table))
    doc.ul([s for s in (_sentence_budgeted_accuracy(inp, split), _sentence_budgeted_time(inp),
                        _sentence_budgeted_speed(inp)) if s])

    doc.h(2, "Side by side: the paper, Kwon et al.'s reported numbers, and this run")
    ours_level = _budgeted_within_tolerance(curve, split)
    speed = _budgeted_speed(inp)
    whole = _whole_prune_seconds(inp)
    ref = PAPER["speedup"]["table"][PAPER["speedup"]["headline_batch"]]
    doc.table(pd.DataFrame({
        "": ["model and task", "what is pruned", "retraining", f"cost removed within {TOLERANCE:g} {inp.point}",
             "measured speedup", "time to prune"],
        "Michel et al. (2019)": ["BERT-base, MNLI", "heads", "none",
                                 f"{PAPER['prunable']['MNLI']} of heads (heads hold about a third of the FLOPs)",
                                 f"+{ref[2]}% examples/s, 50% of heads, batch 64, GPU", "one importance pass"],
        "Kwon et al. (2022), reported": [KWON["where"], "heads + FFN neurons", "none",
                                         f"{_pct(KWON['flops_removed'])} of FLOPs ({KWON['loss']} lost)",
                                         f"{KWON['latency_speedup']}x lower latency",
                                         f"under {KWON['minutes']} minutes on {KWON['hardware']}"],
        "this run (budgeted-tuned)": [
            str((inp.finetune or {}).get("model", "")) + ", " + str((inp.finetune or {}).get("data", "")),
            "heads + FFN neurons", "none",
            f"{_pct(ours_level)} of {cost} ({split})" if ours_level is not None else "none of the levels",
            speed or "not measured", f"{whole:.0f} s on this machine's CPU" if whole is not None else "not measured"],
    }))


def _budget_name(inp: Inputs) -> str:
    return "latency" if ((inp.prune or {}).get("budgeted") or {}).get("budget") == "latency" else "FLOPs"


def _budgeted_within_tolerance(curve: pd.DataFrame, split: str) -> float | None:
    """The largest level at which budgeted-tuned stays within TOLERANCE of unpruned (None if none does)."""
    base = _budgeted_at(curve, split, "budgeted-tuned", 0.0)
    rows = curve[(curve["split"] == split) & (curve["method"] == "budgeted-tuned") & (curve["budget_removed"] > 0)]
    if base is None or rows.empty:
        return None
    ok = rows[rows["metric"] >= base - TOLERANCE - 1e-9]["budget_removed"]
    return float(ok.max()) if not ok.empty else None


def _whole_prune_seconds(inp: Inputs) -> float | None:
    seconds = ((inp.prune or {}).get("budgeted") or {}).get("seconds") or {}
    whole = [v for k, v in seconds.items() if k.startswith("whole_prune@")]
    return float(whole[0]) if whole else None


def _budgeted_speed(inp: Inputs) -> str | None:
    bench = inp.benchmark_budgeted
    if bench is None:
        return None
    pruned = bench[bench["budget_removed"] > 0]
    if pruned.empty:
        return None
    r = pruned.sort_values(["batch_size", "budget_removed"]).iloc[-1]
    return (f"{r.speedup:.2f}x throughput at {_pct(r.budget_removed)} of FLOPs removed, batch {int(r.batch_size)} "
            f"(ideal {r.ideal_speedup:.2f}x, so {r.speedup / r.ideal_speedup:.2f} of ideal)")


def _sentence_budgeted_accuracy(inp: Inputs, split: str) -> str | None:
    curve = inp.budgeted
    if "budgeted-tuned" not in set(curve["method"]):
        return None
    base = _budgeted_at(curve, split, "budgeted-tuned", 0.0)
    at = 0.4 if _budgeted_at(curve, split, "budgeted-tuned", 0.4) is not None else None
    parts = []
    if at is not None and base is not None:
        ours = _budgeted_at(curve, split, "budgeted-tuned", at)
        parts.append(f"With {_pct(at)} of {_budget_name(inp)} removed and no retraining, budgeted-tuned scores "
                     f"{_num(ours)} on "
                     f"{split} against {_num(base)} unpruned ({_signed(ours - base)} {inp.points}; Kwon et al. "
                     f"report {KWON['loss']} lost at {_pct(KWON['flops_removed'])} on BERT-base).")
    margins = []
    for lv in sorted(set(curve["budget_removed"]) - {0.0}):
        ours, paper = _budgeted_at(curve, split, "budgeted-tuned", lv), _budgeted_at(curve, split, "paper", lv)
        if ours is not None and paper is not None:
            margins.append((lv, ours - paper))
    if margins:
        worst = min(m for _, m in margins)
        verdict = "at least as accurate as" if worst >= 0 else "not always as accurate as"
        parts.append(f"Against the paper's heads-only order at equal {_budget_name(inp)} it is {verdict} it at "
                     f"every level the "
                     f"paper's method reaches ({', '.join(f'{_pct(lv)}: {_signed(m)}' for lv, m in margins)}).")
        unreachable = [lv for lv in sorted(set(curve["budget_removed"]) - {0.0})
                       if _budgeted_at(curve, split, "paper", lv) is None]
        if unreachable:
            parts.append(f"Beyond {_pct(margins[-1][0])} pruning every head is not enough: the FFNs hold the rest "
                         f"of the {_budget_name(inp)}.")
    return " ".join(parts) or None


def _sentence_budgeted_time(inp: Inputs) -> str | None:
    whole = _whole_prune_seconds(inp)
    if whole is None:
        return None
    return (f"One whole budgeted-tuned prune (Fisher pass, search, rearrangement and tuning) took {whole:.0f} s on "
            f"this machine's CPU; Kwon et al. report under {KWON['minutes']} minutes on {KWON['hardware']}.")


def _sentence_budgeted_speed(inp: Inputs) -> str | None:
    speed = _budgeted_speed(inp)
    return f"Measured: {speed}; Kwon et al. report {KWON['latency_speedup']}x lower latency." if speed else None


def _section_recovery(doc: Doc, inp: Inputs) -> None:
    rec = inp.recovery
    if rec is None:
        return
    doc.h(1, "Fine-tuning after pruning")
    rec = rec.sort_values("fraction_pruned")
    fig, ax = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
    x = 100 * rec["fraction_pruned"]
    ax.plot(x, rec["metric_before"], "o--", color="C3", label="pruned, before fine-tuning")
    ax.plot(x, rec["metric_after"], "o-", color="C2", label="pruned, after fine-tuning")
    ax.fill_between(x, rec["metric_before"], rec["metric_after"], color="C2", alpha=0.12, lw=0)
    ax.set_xlabel("heads pruned (% of all heads)")
    ax.set_ylabel(inp.metric_label)
    ax.set_title("Recovery by fine-tuning after pruning")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    doc.figure(fig, "recovery.png", f"{inp.metric_name} of pruned models before and after fine-tuning.")
    doc.table(
        pd.DataFrame(
            {
                "heads pruned": rec["fraction_pruned"].map(_pct),
                "before": rec["metric_before"].map(_num),
                "after": rec["metric_after"].map(_num),
                f"recovered ({inp.points})": (rec["metric_after"] - rec["metric_before"]).map(_signed),
            }
        )
    )


def _section_benchmark(doc: Doc, inp: Inputs) -> None:
    bench = inp.benchmark
    if bench is None:
        return
    doc.h(1, "Inference speed")
    impls = list(dict.fromkeys(bench["attn_implementation"]))
    fig, axes = plt.subplots(
        1, len(impls), figsize=(6.0 * len(impls), 4.3), squeeze=False, sharey=True, layout="constrained"
    )
    for ax, impl in zip(axes[0], impls, strict=True):
        part = bench[bench["attn_implementation"] == impl]
        for i, (bs, rows) in enumerate(part.groupby("batch_size")):
            rows = rows.sort_values("fraction_pruned")
            ax.plot(100 * rows["fraction_pruned"], rows["speedup"], "o-", color=f"C{i}", label=f"batch {bs}")
        ideal = part.groupby("fraction_pruned")["ideal_speedup"]
        if (ideal.max() - ideal.min()).max() < 1e-6:  # same for every batch size: draw it once
            ideal = ideal.mean()
            ax.plot(100 * ideal.index, ideal.to_numpy(), "k--", lw=1.2, label="ideal")
        else:
            for i, (_, rows) in enumerate(part.groupby("batch_size")):
                rows = rows.sort_values("fraction_pruned")
                ax.plot(
                    100 * rows["fraction_pruned"],
                    rows["ideal_speedup"],
                    "--",
                    color=f"C{i}",
                    lw=1,
                    label="ideal" if i == 0 else None,
                )
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set_title(f"attention: {impl}")
        ax.set_xlabel("heads pruned (% of all heads)")
        ax.set_ylabel("speedup (x, throughput vs. unpruned)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Measured vs. ideal inference speedup")
    doc.figure(fig, "speedup.png", "Throughput speedup of the physically pruned model; dashed: ideal speedup.")

    if "tokens_per_s" in bench:
        # Decoding speed: the paper's Table 4 measured BERT classification, so it is not set beside it.
        rows = bench.sort_values(["attn_implementation", "batch_size", "fraction_pruned"])
        doc.h(2, "Decoding speed (every model generates the same number of tokens)")
        doc.table(pd.DataFrame({
            "attention": rows["attn_implementation"], "batch": rows["batch_size"],
            "heads pruned": rows["fraction_pruned"].map(_pct), "sentences/s": rows["examples_per_s"].map(_num),
            "tokens/s": rows["tokens_per_s"].map(lambda v: _num(v, 0)),
            "speedup": rows["speedup"].map(lambda v: _num(v, 2)),
            "ideal (FLOPs)": rows["ideal_speedup"].map(lambda v: _num(v, 2))}))
    table = None if "tokens_per_s" in bench else _table4(bench)
    if table is not None:
        frac, df = table
        doc.h(2, f"Compared with the paper's Table 4 ({_pct(frac)} of heads pruned)")
        doc.table(df)
    if "peak_memory_mb" in bench and bench["peak_memory_mb"].notna().any():
        mem = bench.dropna(subset=["peak_memory_mb"]).drop_duplicates(["attn_implementation", "fraction_pruned"])
        columns = [c for c in ("weights_mb", "activations_mb", "peak_memory_mb") if c in mem]
        mem = mem.sort_values(["attn_implementation", "fraction_pruned"])[
            ["attn_implementation", "batch_size", "fraction_pruned", *columns]]
        mem["fraction_pruned"] = mem["fraction_pruned"].map(_pct)
        mem = mem.rename(columns={"attn_implementation": "attention", "batch_size": "batch",
                                  "fraction_pruned": "heads pruned", "weights_mb": "weights (MiB)",
                                  "activations_mb": "peak activations (MiB)", "peak_memory_mb": "peak total (MiB)"})
        doc.h(2, "Peak memory of one forward pass")
        doc.p("Weights plus the peak of live activations, from torch's CPU allocator (exact, not the "
              "process's resident set). Heads hold a small share of the weights, and under sdpa the "
              "feed-forward activations, not attention scores, set the peak.")
        doc.table(mem.astype(object).map(lambda v: _num(v, 1) if isinstance(v, float) else v))


def _table4(bench: pd.DataFrame) -> tuple[float, pd.DataFrame] | None:
    """Our throughput at the pruned level closest to the paper's 50%, next to the paper's numbers."""
    ref = PAPER["speedup"]
    pruned = bench[bench["fraction_pruned"] > 0]
    if pruned.empty:
        return None
    fracs = pruned["fraction_pruned"].unique()
    frac = float(fracs[np.argmin(np.abs(fracs - ref["fraction_pruned"]))])
    rows = []
    for r in _at(bench, "fraction_pruned", frac).sort_values(["attn_implementation", "batch_size"]).itertuples():
        full = bench[(bench["attn_implementation"] == r.attn_implementation) & (bench["batch_size"] == r.batch_size)]
        full = _at(full, "fraction_pruned", 0.0)
        paper = ref["table"].get(int(r.batch_size))
        rows.append(
            {
                "attention": r.attn_implementation,
                "batch": int(r.batch_size),
                "unpruned ex/s": _num(full["examples_per_s"].mean()) if not full.empty else "",
                "pruned ex/s": _num(r.examples_per_s),
                "speedup": f"{_signed(100 * (r.speedup - 1))}%",
                "ideal": f"{_signed(100 * (r.ideal_speedup - 1))}%",
                "paper ex/s": f"{paper[0]} -> {paper[1]}" if paper else "",
                "paper speedup": f"{_signed(paper[2])}%" if paper else "",
            }
        )
    return frac, pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------
# "Compared with the paper": one computed sentence per claim


def _sentence_prunable(inp: Inputs) -> str | None:
    curve = inp.curve
    if curve is None or "importance" not in set(curve["method"]):
        return None
    parts = []
    for split in [s for s in ("test", "dev") if s in set(curve["split"])]:
        res = prunable_fraction(curve, "importance", split)
        if res is not None:
            frac, metric, base = res
            parts.append(f"{_pct(frac)} of heads on {split} ({_num(base)} -> {_num(metric)})")
    if not parts:
        return None
    task = inp.task
    if task is not None:
        paper = f"{PAPER['prunable'][task]} on {task}"
    else:
        paper = f"{PAPER['prunable']['MNLI']} for BERT on MNLI and {PAPER['prunable']['SST-2']} on SST-2"
    return (
        f"Pruning heads by importance stays within {TOLERANCE:g} {inp.point} of the unpruned model "
        f"up to {' and '.join(parts)}; the paper reports {paper}."
    )


def _sentence_single_head(inp: Inputs) -> str | None:
    df = inp.ablation
    if df is None:
        return None
    ref = PAPER["single_head"]["mt" if inp.is_mt else "bert"]
    paper = f"the paper finds {ref['significant']} of {ref['of']} in {ref['where']}" + (
        f", {ref['improving']} of them improving" if ref["significant"] else ""
    )
    pieces = []
    for kind in _kinds(df):
        part = df[df["kind"] == kind]
        sig = part[part["p_value"] < ALPHA]
        label = f" {KIND_LABEL.get(kind, kind)}" if len(_kinds(df)) > 1 else ""
        pieces.append(f"{len(sig)} of {len(part)}{label} heads ({int((sig['delta'] > 0).sum())} improving)")
    if (df["p_value"] < ALPHA).sum() == 0:
        ours = f"No single head's removal changes {inp.metric_name} significantly (p < {ALPHA}, "
    else:
        ours = f"Removing a single head changes {inp.metric_name} significantly (p < {ALPHA}) for "
    return f"{ours}{'; '.join(pieces)}{')' if ours.endswith(', ') else ''}; {paper}."


def _sentence_recovery(inp: Inputs) -> str | None:
    rec = inp.recovery
    if rec is None:
        return None
    gain = rec["metric_after"] - rec["metric_before"]
    top = rec.loc[rec["fraction_pruned"].idxmax()]
    return (
        f"Fine-tuning after pruning recovers {_signed(gain.mean())} {inp.points} on average "
        f"(from {_signed(gain.min())} to {_signed(gain.max())} over {_plural(len(rec), 'level')}); at "
        f"{_pct(top['fraction_pruned'])} pruned it goes from {_num(top['metric_before'])} to "
        f"{_num(top['metric_after'])}. The paper prunes without any retraining."
    )


def _sentence_speedup(inp: Inputs) -> str | None:
    bench = inp.benchmark
    if bench is None:
        return None
    ref = PAPER["speedup"]
    frac, batch = ref["fraction_pruned"], ref["headline_batch"]
    rows = _at(bench, "fraction_pruned", frac)
    rows = rows[rows["batch_size"] == batch]
    if rows.empty:
        return None
    measured = "; ".join(
        f"{_signed(100 * (r.speedup - 1))}% with {r.attn_implementation} attention "
        f"(ideal {_signed(100 * (r.ideal_speedup - 1))}%)"
        for r in rows.itertuples()
    )
    return (
        f"With {_pct(frac)} of heads pruned at batch size {batch}, throughput changes by {measured}; "
        f"the paper measured {_signed(ref['table'][batch][2])}% (BERT-base, GTX 1080Ti)."
    )


def _sentence_vs_random(inp: Inputs, low: float = 0.2, high: float = 0.8) -> str | None:
    curve = inp.curve
    if curve is None or not {"importance", "random"} <= set(curve["method"]):
        return None
    parts = []
    for split in _splits(curve):
        part = curve[curve["split"] == split]
        imp = part[part["method"] == "importance"].groupby(part["fraction_pruned"].round(6))["metric"].mean()
        rnd = part[part["method"] == "random"].groupby(part["fraction_pruned"].round(6))["metric"].mean()
        levels = sorted(f for f in set(imp.index) & set(rnd.index) if low - 1e-9 <= f <= high + 1e-9)
        if not levels:
            continue
        losing = [f for f in levels if not imp[f] > rnd[f]]
        if not losing:
            parts.append(f"at all {len(levels)} levels on {split}")
        else:
            parts.append(
                f"at {len(levels) - len(losing)} of {len(levels)} levels on {split} "
                f"(not at {', '.join(_pct(f) for f in losing)})"
            )
    if not parts:
        return None
    every = all(p.startswith("at all") for p in parts)
    return (
        f"Importance-based pruning {'beats' if every else 'does not always beat'} random pruning between "
        f"{_pct(low)} and {_pct(high)} of heads pruned: better {'; '.join(parts)}."
    )


def _sentence_cross_collapse(inp: Inputs) -> str | None:
    """Paper, Figure 5: cross-attention cannot be pruned beyond ~60% while self-attention can."""
    curve = inp.curve
    if curve is None or "importance-cross" not in set(curve["method"]):
        return None
    split = "test" if "test" in set(curve["split"]) else _splits(curve)[0]
    part = curve[curve["split"] == split]
    threshold = PAPER["cross_collapse_above"]
    losses = {}
    for kind in KIND_ORDER:
        rows = part[part["method"] == f"importance-{kind}"].sort_values("fraction_pruned")
        base = _baseline(rows)
        above = rows[rows["fraction_pruned"] > threshold + 1e-9]
        if base is not None and not above.empty:
            losses[kind] = (float(above["fraction_pruned"].max()), base - float(above["metric"].iloc[-1]))
    if "cross" not in losses:
        return None
    frac, cross_loss = losses["cross"]
    others = [f"{_num(loss)} for {KIND_LABEL[k]}" for k, (_, loss) in losses.items() if k != "cross"]
    sharper = all(cross_loss > loss for k, (_, loss) in losses.items() if k != "cross")
    verdict = (
        "it collapses much more than self-attention, as in the paper"
        if sharper and others
        else "it does not collapse more than self-attention, unlike the paper"
        if others
        else "the paper reports a collapse beyond " + _pct(threshold)
    )
    versus = f" (vs. {', '.join(others)})" if others else ""
    return (
        f"Pruning {_pct(frac)} of cross-attention heads costs {_num(cross_loss)} {inp.points} on {split}"
        f"{versus}; {verdict}."
    )


def _sentence_early_importance(inp: Inputs) -> str | None:
    """Paper, Section 6: which heads matter is settled early in training, and robustness to pruning grows."""
    correlation = (inp.prune or {}).get("importance_rank_correlation_with_final")
    curve = inp.curve
    if not correlation or curve is None:
        return None
    steps = sorted(correlation, key=float)
    split = "test" if "test" in set(curve["split"]) else _splits(curve)[0]
    # BLEU kept at half the heads pruned, relative to each checkpoint's own unpruned BLEU (Figure 6 is relative:
    # an early checkpoint's BLEU is near 0, so "within 1 point" would say nothing).
    kept = {}
    for step in steps:
        rows = curve[(curve["method"] == f"checkpoint-{step}") & (curve["split"] == split)]
        base, half = _baseline(rows), rows[np.isclose(rows["fraction_pruned"], 0.5)]
        if base and not half.empty:
            kept[step] = float(half["metric"].iloc[0]) / base
    ranks = ", ".join(f"{correlation[s]:.2f} at step {s}" for s in steps[:-1])
    final = float(steps[-1])
    formed = [s for s in steps[:-1] if correlation[s] >= 0.7]
    if formed and float(formed[0]) <= final / 3:
        verdict = (f"the ranking is largely in place (rho >= 0.7) by step {formed[0]} of {steps[-1]}, as the paper "
                   "found (important heads are determined early)")
    elif formed:
        verdict = (f"the ranking settles (rho >= 0.7) only at step {formed[0]} of {steps[-1]}, later than the "
                   "paper's finding that important heads are determined early")
    else:
        verdict = ("the ranking keeps changing until the end of training, unlike the paper's finding that "
                   "important heads are determined early")
    retained = ""
    if kept:
        retained = ("; with half the heads pruned, checkpoints keep "
                    + ", ".join(f"{100 * r:.0f}% (step {s})" for s, r in kept.items()) + " of their own BLEU")
    return f"Head importance at each checkpoint vs. the final model (Spearman): {ranks}; {verdict}{retained}."


def _section_paper(doc: Doc, inp: Inputs) -> None:
    sentences = [
        s
        for s in (
            _sentence_prunable(inp),
            _sentence_single_head(inp),
            _sentence_recovery(inp),
            _sentence_speedup(inp),
            _sentence_vs_random(inp),
            _sentence_cross_collapse(inp),
            _sentence_early_importance(inp),
        )
        if s
    ]
    if sentences:
        doc.h(1, "Compared with the paper")
        doc.ul(sentences)


# --------------------------------------------------------------------------------------------------
# Entry points


def build_report(report_dir: Path, title: str) -> Path:
    """Render report.md, report.html (self-contained) and figures/*.png from the files in report_dir.

    Returns the path of report.html.
    """
    report_dir = Path(report_dir)
    inp = Inputs.load(report_dir)
    doc = Doc()
    # The summary comes first: it is what a reader wants; the sections below back it up.
    _section_paper(doc, inp)
    _section_setup(doc, inp)
    _section_curves(doc, inp)
    _section_budgeted(doc, inp)
    _section_importance(doc, inp)
    _section_ablation(doc, inp)
    _section_one_head(doc, inp)
    _section_recovery(doc, inp)
    _section_benchmark(doc, inp)
    if not doc.blocks:
        doc.p(f"No results found in {report_dir}.")

    fig_dir = report_dir / "figures"
    for item in doc.figures:
        write_bytes(fig_dir / item.name, item.png)
    # Drop figures of sections that no longer have data, so the folder matches the report.
    current = {item.name for item in doc.figures}
    for stale in fig_dir.glob("*.png") if fig_dir.is_dir() else []:
        if stale.name not in current:
            stale.unlink()
    write_bytes(report_dir / "report.md", _to_markdown(doc, title).encode("utf-8"))
    html_path = report_dir / "report.html"
    write_bytes(html_path, _to_html(doc, title).encode("utf-8"))
    return html_path


def main() -> None:
    parser = argparse.ArgumentParser(description="Render report.md / report.html from experiment outputs.")
    parser.add_argument("report_dir", type=Path)
    parser.add_argument("--title", default="Are Sixteen Heads Really Better than One? - reproduction")
    args = parser.parse_args()
    print(build_report(args.report_dir, args.title))


if __name__ == "__main__":
    main()

"""The report's figures, drawn with matplotlib and returned as PNG bytes.

Identical inputs give byte-identical PNGs, so DVC's hashes of figures/ only move when the numbers do.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # headless; must precede the pyplot import

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pipeline.files.schema import KIND_LABELS, LOWER_IS_BETTER, RANDOM, tolerance_text, worst_acceptable  # noqa: E402
from pipeline.report.inputs import Inputs, budgeted_at, checkpoint_of, splits_in, unpruned  # noqa: E402


def png_bytes(fig: plt.Figure) -> bytes:
    """`fig` as PNG bytes, closed; also the studies' figures (pipeline/studies)."""
    buf = io.BytesIO()
    # No "Software" metadata: identical inputs give byte-identical PNGs (stable DVC hashes).
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _style(method: str, index: int, n_dynamics: int = 0) -> dict:
    if method == RANDOM:
        return {"color": "0.45", "ls": "--", "marker": "s"}
    if checkpoint_of(method) is not None and n_dynamics:
        # Early -> late checkpoint as dark -> light; stop before viridis' pale yellow end.
        return {"color": plt.cm.viridis(0.85 * index / max(1, n_dynamics - 1)), "ls": "-", "marker": "."}
    return {"color": f"C{index % 10}", "ls": "-", "marker": "o"}


def _tolerance_line(ax: plt.Axes, base: float, inp: Inputs) -> None:
    sign = "+" if inp.metric in LOWER_IS_BETTER else "-"
    ax.axhline(worst_acceptable(inp.metric, base), color="0.6", lw=0.8, ls=":",
               label=f"unpruned {sign} {tolerance_text(inp.metric, inp.point)}")


def heatmaps(
    frames: dict[str, pd.DataFrame],
    value: str,
    cbar_label: str,
    title: str,
    diverging: bool,
    marks: dict[str, pd.DataFrame] | None = None,
) -> bytes:
    """One layer x head heatmap per kind, side by side, sharing one colour scale; `marks` boxes heads with a *."""
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
        ax.set_title(KIND_LABELS.get(kind, kind) if len(kinds) > 1 else title, fontsize=10)
        if marks is not None and kind in marks:
            rows, cols = list(grid.index), list(grid.columns)
            for r in marks[kind].itertuples(index=False):
                y, x = rows.index(r.layer), cols.index(r.head)
                ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="black", lw=1.5))
                ax.text(x, y, "*", ha="center", va="center", fontsize=9, color="black")
    if len(kinds) > 1:
        fig.suptitle(title)
    fig.colorbar(image, ax=axes[0].tolist(), label=cbar_label, shrink=0.9)
    return png_bytes(fig)


def curves(inp: Inputs, curve: pd.DataFrame, methods: list[str], x: str, xlabel: str, title: str) -> bytes:
    """The metric of each method against `x` (share of heads pruned or of FLOPs removed), one panel per split."""
    splits = splits_in(curve)
    fig, axes = plt.subplots(
        1, len(splits), figsize=(6.0 * len(splits), 4.3), squeeze=False, sharey=True, layout="constrained"
    )
    n_dyn = sum(checkpoint_of(m) is not None for m in methods)
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
        base = None if n_dyn else unpruned(part[part["method"].isin(methods)])
        if base is not None:
            _tolerance_line(ax, base, inp)
        ax.set_title(f"{split} split")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(inp.metric_label)
        if x == "fraction_pruned":
            ax.set_xlim(-2, 102)  # same axes as the paper's figures; FLOPs removed stays autoscaled
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="lower left")
    fig.suptitle(title)
    return png_bytes(fig)


def budgeted(inp: Inputs, curve: pd.DataFrame, methods: list[str]) -> bytes:
    """The metric of each budgeted method against the share of the cost removed, one panel per split."""
    splits = splits_in(curve)
    cost = inp.budget_name
    fig, axes = plt.subplots(1, len(splits), figsize=(6.0 * len(splits), 4.3), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, split in zip(axes[0], splits, strict=True):
        part = curve[curve["split"] == split]
        for i, method in enumerate(methods):
            rows = part[part["method"] == method].sort_values("budget_removed")
            ax.plot(100 * rows["budget_removed"], rows["metric"], label=method, ms=3.5, lw=1.5, **_style(method, i))
        base = budgeted_at(curve, split, methods[0], 0.0)
        if base is not None:
            _tolerance_line(ax, base, inp)
        ax.set_title(f"{split} split")
        ax.set_xlabel(f"{cost} removed (% of the model's)")
        ax.set_ylabel(inp.metric_label)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="lower left")
    fig.suptitle(f"Accuracy at equal {cost}")
    return png_bytes(fig)


def kept_per_layer(layers: pd.DataFrame, methods: list[str], cost: str) -> bytes:
    """What each method keeps at each level: one panel per method, a row per layer's heads and FFN neurons, a
    column per level, coloured by the share kept and labelled with the count."""
    many_kinds = layers["kind"].nunique() > 1
    rows = layers[["kind", "layer", "unit"]].drop_duplicates().sort_values(["unit", "kind", "layer"])
    labels = [f"{k} {lay} {u}" if many_kinds else f"layer {lay} {u}" for k, lay, u in rows.itertuples(index=False)]
    levels = sorted(layers["budget_removed"].unique())
    fig, axes = plt.subplots(1, len(methods), figsize=(0.9 + 0.5 * len(levels) * len(methods) + 1.2 * len(methods),
                                                       1.0 + 0.3 * len(labels)), squeeze=False, sharey=True,
                             layout="constrained")
    image = None
    for ax, method in zip(axes[0], methods, strict=True):
        part = layers[layers["method"] == method]
        kept = part.pivot_table(index=["unit", "kind", "layer"], columns="budget_removed", values="kept")
        of = part.pivot_table(index=["unit", "kind", "layer"], columns="budget_removed", values="of")
        index = pd.MultiIndex.from_frame(rows[["unit", "kind", "layer"]])
        kept, of = kept.reindex(index=index, columns=levels), of.reindex(index=index, columns=levels)
        image = ax.imshow((kept / of).to_numpy(dtype=float), cmap="viridis", vmin=0, vmax=1, aspect="auto")
        for (i, j), count in np.ndenumerate(kept.to_numpy(dtype=float)):
            if np.isfinite(count):
                ax.text(j, i, f"{count:.0f}", ha="center", va="center", fontsize=6,
                        color="white" if count / of.to_numpy(dtype=float)[i, j] < 0.5 else "black")
        ax.set_xticks(range(len(levels)), [f"{100 * lv:.0f}" for lv in levels], fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlabel(f"{cost} removed (%)")
        ax.set_title(method, fontsize=9)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="share of the layer's units kept")
    fig.suptitle(f"What each method keeps, layer by layer, at equal {cost}")
    return png_bytes(fig)


def recovery(inp: Inputs, rec: pd.DataFrame) -> bytes:
    """The metric of each pruned model before and after fine-tuning (by each recovery method, where the table has
    several); `rec` sorted by fraction pruned."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
    methods = list(dict.fromkeys(rec["method"])) if "method" in rec else [None]
    first = rec if methods == [None] else rec[rec["method"] == methods[0]]
    ax.plot(100 * first["fraction_pruned"], first["metric_before"], "o--", color="C3",
            label="pruned, before fine-tuning")
    for i, method in enumerate(methods):
        rows = rec if method is None else rec[rec["method"] == method]
        x = 100 * rows["fraction_pruned"]
        ax.plot(x, rows["metric_after"], "o-", color=f"C{2 + 2 * i}",
                label="pruned, after fine-tuning" + (f" ({method})" if len(methods) > 1 else ""))
        ax.fill_between(x, rows["metric_before"], rows["metric_after"], color=f"C{2 + 2 * i}", alpha=0.12, lw=0)
    ax.set_xlabel("heads pruned (% of all heads)")
    ax.set_ylabel(inp.metric_label)
    ax.set_title("Recovery by fine-tuning after pruning")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return png_bytes(fig)


def distillation(rec: pd.DataFrame) -> bytes:
    """Language models: each saved model's test perplexity before recovery and after each recovery method, over the
    unpruned model's, bars side by side by model (the control, the unpruned model recovered, first)."""
    models, methods = list(dict.fromkeys(rec["model"])), list(dict.fromkeys(rec["method"]))
    fig, ax = plt.subplots(figsize=(7.5, 4.2), layout="constrained")
    width = 0.8 / (len(methods) + 1)
    x = np.arange(len(models))
    before = rec.drop_duplicates("model").set_index("model").loc[models]
    ax.bar(x, before["metric_before"] / before["metric_unpruned"], width, color="C3", label="before recovery")
    for i, method in enumerate(methods):
        after = rec[rec["method"] == method].set_index("model").loc[models]
        ax.bar(x + (i + 1) * width, after["metric_after"] / after["metric_unpruned"], width, color=f"C{i}",
               label=f"after {method}")
    ax.axhline(1.0, color="0.3", lw=0.8, ls="--", label="unpruned")
    ax.set_xticks(x + width * len(methods) / 2, models, fontsize=8)
    ax.set_ylabel("test perplexity / unpruned model's")
    ax.set_title("Recovery at equal tokens: distillation against the next token")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return png_bytes(fig)


def _speedup_panel(ax: plt.Axes, title: str, xlabel: str) -> None:
    """A speedup panel's no-change line, title, axis labels, grid and legend."""
    ax.axhline(1.0, color="0.6", lw=0.8)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("speedup (x, throughput vs. unpruned)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def speedup(bench: pd.DataFrame) -> bytes:
    """Measured and ideal throughput speedup against the share of heads pruned, one panel per attention and
    precision."""
    precisions = list(dict.fromkeys(bench["precision"]))
    panels = [(impl, p) for impl in dict.fromkeys(bench["attn_implementation"]) for p in precisions
              if ((bench["attn_implementation"] == impl) & (bench["precision"] == p)).any()]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6.0 * len(panels), 4.3), squeeze=False, sharey=True, layout="constrained"
    )
    for ax, (impl, precision) in zip(axes[0], panels, strict=True):
        part = bench[(bench["attn_implementation"] == impl) & (bench["precision"] == precision)]
        for i, (bs, rows) in enumerate(part.groupby("batch_size")):
            rows = rows.sort_values("fraction_pruned")
            x = 100 * rows["fraction_pruned"]
            ax.plot(x, rows["speedup"], "o-", color=f"C{i}", label=f"batch {bs}")
            ax.errorbar(x, rows["speedup"], yerr=[rows["speedup"] - rows["speedup_min"],  # the rounds' range
                                                  rows["speedup_max"] - rows["speedup"]],
                        fmt="none", ecolor=f"C{i}", capsize=3, lw=1)
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
        _speedup_panel(ax, f"attention: {impl}" + (f", {precision}" if len(precisions) > 1 else ""),
                       "heads pruned (% of all heads)")
    fig.suptitle("Measured vs. ideal inference speedup")
    return png_bytes(fig)


def budgeted_speed(rows: pd.DataFrame) -> bytes:
    """Each saved budgeted model's measured speedup against batch size, with its rounds' range, beside its ideal
    from FLOPs and, where the benchmark timed a floor model, its Amdahl estimate; one panel per attention and
    precision."""
    panels = list(dict.fromkeys(zip(rows["attn_implementation"], rows["precision"], strict=True)))
    several = len({p for _, p in panels}) > 1
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.3), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, (impl, precision) in zip(axes[0], panels, strict=True):
        part = rows[(rows["attn_implementation"] == impl) & (rows["precision"] == precision)]
        for i, ((level, widths), model) in enumerate(part.groupby(["budget_removed", "widths"], sort=True)):
            model = model.sort_values("batch_size")
            x, color = model["batch_size"].to_numpy(), f"C{i}"
            ax.errorbar(x, model["speedup"], yerr=[model["speedup"] - model["speedup_min"],  # the rounds' range
                                                   model["speedup_max"] - model["speedup"]],
                        fmt="o-", color=color, capsize=3, lw=1.5, label=f"{100 * level:g}% removed, {widths}")
            ax.plot(x, model["ideal_speedup"], "--", color=color, lw=1, label="ideal (FLOPs)" if i == 0 else None)
            if "amdahl_speedup" in model and model["amdahl_speedup"].notna().all():
                ax.plot(x, model["amdahl_speedup"], ":", color=color, lw=1.5,
                        label="Amdahl estimate (floor)" if i == 0 else None)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(part["batch_size"])), [str(b) for b in sorted(set(part["batch_size"]))])
        _speedup_panel(ax, f"attention: {impl}" + (f", {precision}" if several else ""), "batch size")
    fig.suptitle("Budgeted models: measured speedup, its FLOP ideal and its Amdahl estimate from the floor")
    return png_bytes(fig)


def zero_shot(table: pd.DataFrame) -> bytes:
    """Each model's zero-shot accuracy per task (zero_shot.csv), as horizontal bars in the table's model order."""
    pivot = table.pivot(index="model", columns="task", values="value").loc[list(dict.fromkeys(table["model"]))]
    fig, ax = plt.subplots(figsize=(7.5, 0.5 + 0.45 * len(pivot) * len(pivot.columns)), layout="constrained")
    (100 * pivot).plot.barh(ax=ax)
    ax.invert_yaxis()
    ax.set_xlabel("zero-shot accuracy (%)")
    ax.set_ylabel("")
    ax.set_title("Zero-shot accuracy (lm-evaluation-harness)")
    ax.grid(axis="x", alpha=0.3)
    return png_bytes(fig)


def width(table: pd.DataFrame, corpus: str) -> bytes:
    """Perplexity over the unpruned model's against the share of parameters removed (width_curve.csv), one line per
    method and compensation on one corpus; the project's method drawn thick."""
    rows = table[(table["corpus"] == corpus) & (table["method"] != "unpruned")]
    fig, ax = plt.subplots(figsize=(7.5, 4.8), layout="constrained")
    for (method, compensation, allocation), line in rows.groupby(["method", "compensation", "allocation"], sort=False):
        line = line.sort_values("params_removed")
        ours = method == "ours"
        ax.plot(100 * line["params_removed"], line["vs_unpruned"], marker="o", ms=3, lw=2.6 if ours else 1.1,
                ls="-" if compensation != "none" else "--",
                label=f"{method} ({compensation}{', ' + allocation if ours else ''})")
    ax.set_yscale("log")
    ax.set_xlabel("non-embedding parameters removed (%)")
    ax.set_ylabel("perplexity / unpruned (log)")
    ax.set_title(f"Width pruning with no retraining: {corpus}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return png_bytes(fig)

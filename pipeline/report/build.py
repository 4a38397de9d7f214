"""Render the experiment report: figures (PNG), report.md and a self-contained report.html.

The inputs are the tables the stages wrote to the report folder (`inputs`); each section (`sections`) adds
what its inputs support to one document (`document`), which is written twice, as Markdown and as HTML.

By hand:  python -m pipeline.studies.report <report_dir> [--task TASK] [--title "..."]

Nothing here imports torch or transformers: the report stage starts in about 3 s, not 12.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.files.atomic import write_bytes
from pipeline.report.document import Doc, to_html, to_markdown
from pipeline.report.inputs import Inputs
from pipeline.report.sections import SECTIONS


def build_report(report_dir: Path, title: str | None = None,
                 family_sections: Sequence[Callable[[Doc, Inputs], None]] = ()) -> Path:
    """Render report.md, report.html (self-contained) and figures/*.png from the files in report_dir, titled
    `title` or by default after the model and data that finetune.json names: the shared sections, then the task
    family's own (`family_sections`, its `report` module's SECTIONS).

    Returns the path of report.html.
    """
    report_dir = Path(report_dir)
    inp = Inputs.load(report_dir)
    title = title or inp.title
    doc = Doc()
    for section in (*SECTIONS, *family_sections):
        section(doc, inp)
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
    write_bytes(report_dir / "report.md", to_markdown(doc, title).encode("utf-8"))
    html_path = report_dir / "report.html"
    write_bytes(html_path, to_html(doc, title).encode("utf-8"))
    return html_path

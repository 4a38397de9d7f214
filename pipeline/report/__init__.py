"""The experiment report: report.md, a self-contained report.html and figures/, beside the paper's findings.

    inputs.py           the tables and summaries the stages wrote, read and checked against the schema
    document.py         the document model and its Markdown and HTML renderers
    figures.py          the matplotlib figures, as PNG bytes
    paper.py            the papers' numbers and claims, and the sentences that set this run beside them
    sections.py         the report's sections, headed by the paper's artefacts (Tables 1-4, Figures 3-6)
    build.py            `build_report`: the sections in order, written to the report folder
    plots_template.py   the offline HTML template of `dvc plots` (standalone)

Nothing is imported here, so the plots template runs without matplotlib: import `pipeline.report.build`. The
command lines that render either by hand are `pipeline.studies.report` and `pipeline.studies.plots_template`.
"""

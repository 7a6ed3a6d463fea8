"""One definition of each run figure (figures.py): docs/metrics.md's table is its table, and a value is written in
its figure's own unit."""

from pathlib import Path

from tunelab import figures

REPO = Path(__file__).resolve().parents[2]


def test_metrics_doc_lists_every_figure_as_defined():
    doc = (REPO / "docs" / "metrics.md").read_text()
    assert "\n".join(figures.markdown_rows()) in doc


def test_each_figure_writes_its_own_unit():
    assert figures.text("tokens_padded_per_s", 139.4) == "139 tokens/s"
    assert figures.text("train_s", 138.0) == "2.3 min"
    assert figures.text("peak_memory_bytes", 2.13 * 2**30) == "2.13 GiB"
    assert figures.text("steps", 1200) == "1,200"
    assert figures.text("train_s", None) == ""
    row = figures.row("peak_memory_bytes", 2**30, None)
    assert (row["label"], row["unit"], row["measured_text"], row["predicted_text"]) == (
        "peak memory",
        "GiB",
        "1.00 GiB",
        "",
    )

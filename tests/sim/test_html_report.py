"""``pollux simulate --html``: one self-contained page with the tables and the figures."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import pytest

from pollux.cli.main import main
from pollux.sim.html_report import TextTable, table_html


def test_simulate_writes_one_self_contained_page(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    page_path = tmp_path / "sub" / "report.html"
    assert main(["simulate", "--policy", "fifo,tiresias", "--jobs", "8", "--hours", "1",
                 "--nodes", "2", "--processes", "1", "--html", str(page_path)]) == 0
    assert f"wrote {page_path}" in capsys.readouterr().out.replace("\n", "")
    page = page_path.read_text()
    assert "<th>fifo</th><th>tiresias</th>" in page and "avg JCT (mean)" in page
    sources = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page)
    assert len(sources) >= 4  # JCT CDF, average JCT, a timeline per run, GPUs over time
    assert all(s.startswith("data:image/png;base64,") for s in sources), sources[:3]
    for source in sources:
        image = Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1])))
        assert image.width > 100 and image.height > 100


def test_cells_are_escaped() -> None:
    text = table_html(TextTable("<t>", ("a", "b"), (("<script>", "1 & 2"),)))
    assert "<script>" not in text and "&lt;script&gt;" in text and "1 &amp; 2" in text

"""tools/screenshot_notebook.py: the notebook-in-a-browser check.

The end-to-end test needs a Chromium binary and the Python ``playwright`` package (no downloaded
browser); without them it is skipped with the reason, so CI (no Chromium) pays nothing. Set
``FOVI_SKIP_SCREENSHOT=1`` to skip it on a machine that has both.
"""

import importlib.util
import os
import socket
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "screenshot_notebook.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("screenshot_notebook", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_helpers_need_no_browser(tmp_path, capsys):
    tool = _load_tool()
    port = tool.free_port()
    with socket.socket() as s:  # the port really is free
        s.bind(("127.0.0.1", port))
    assert tool.find_chromium(str(tmp_path / "no-such-browser")) in (None, tool.find_chromium())
    assert "--no-sandbox" in tool.CHROMIUM_ARGS and "--disable-gpu" in tool.CHROMIUM_ARGS
    # a missing notebook is a clear "could not run" (exit code 2), never a traceback
    if tool.playwright_available():
        assert tool.main([str(tmp_path / "missing.ipynb"), str(tmp_path / "x.png")]) == 2
        assert "does not exist" in capsys.readouterr().err
    else:
        assert tool.main([str(tmp_path / "missing.ipynb"), str(tmp_path / "x.png")]) == 2
        assert "playwright" in capsys.readouterr().err


def _skip_reason():
    if os.environ.get("FOVI_SKIP_SCREENSHOT"):
        return "FOVI_SKIP_SCREENSHOT is set"
    tool = _load_tool()
    if tool.find_chromium() is None:
        return "no Chromium binary (apt-get install chromium, or set $CHROMIUM)"
    if not tool.playwright_available():
        return "the Python package 'playwright' is not installed (pip install playwright; no browser download)"
    return None


@pytest.mark.slow
def test_screenshot_runs_a_notebook_and_finds_its_error(tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    tool = _load_tool()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# screenshot test"),
        nbformat.v4.new_code_cell("import plotly.graph_objects as go\ngo.Figure(go.Bar(x=[1, 2, 3], y=[3, 1, 2]))"),
        nbformat.v4.new_code_cell("import ipywidgets as W\nW.VBox([W.IntSlider(3), W.Button(description='Run')])"),
        nbformat.v4.new_code_cell("1 / 0"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "shot.ipynb"
    nbformat.write(nb, path)
    before = path.read_bytes()
    png = tmp_path / "out" / "shot.png"
    report = tool.screenshot_notebook(path, png, timeout=180)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert report["cells"] == report["executed"] == 3
    assert report["plots"] >= 1 and report["widgets"] >= 1
    assert report["notebook_unchanged"] and path.read_bytes() == before
    # the failing cell is found, so the run is not ok
    assert any("ZeroDivisionError" in e for e in report["errors"]), report["errors"]
    assert report["ok"] is False

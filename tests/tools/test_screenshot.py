"""tools/screenshot_notebook.py and the Makefile's screenshot targets: the notebook-in-a-browser check.

The Makefile tests need ``make`` and a git checkout (skipped without them): the PNGs that
``make screenshot`` / ``make screenshots`` write by default must be git-ignored, untracked paths, so
a run never leaves the checkout dirty. The end-to-end test needs a Chromium binary and the Python
``playwright`` package (no downloaded browser); without them it is skipped with the reason, so CI
(no Chromium) pays nothing. Set ``FOVI_SKIP_SCREENSHOT=1`` to skip it on a machine that has both.
"""

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import zlib
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]
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


def _tiny_png(width, height):
    def chunk(kind, data):
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    raw = b"".join(b"\x00" + bytes(width) for _ in range(height))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def test_png_size_and_stored_outputs(tmp_path):
    tool = _load_tool()
    png = tmp_path / "a.png"
    png.write_bytes(_tiny_png(3, 7))
    assert tool.png_size(png) == (3, 7)
    (tmp_path / "b.png").write_bytes(b"not a png at all, not at all")
    with pytest.raises(ValueError):
        tool.png_size(tmp_path / "b.png")
    nb = nbformat.v4.new_notebook()
    plot = nbformat.v4.new_output("display_data", data={"application/vnd.plotly.v1+json": {}, "text/plain": "F"})
    nb.cells = [nbformat.v4.new_code_cell("f", outputs=[plot, plot]), nbformat.v4.new_markdown_cell("x")]
    nbformat.write(nb, tmp_path / "n.ipynb")
    assert tool.stored_outputs(tmp_path / "n.ipynb") == {"plots": 2, "widgets": 0}
    assert tool.stored_outputs(tmp_path / "missing.ipynb") == {"plots": 0, "widgets": 0}


# --- the Makefile's default outputs ---------------------------------------------------------------

_TOOL_CALL = re.compile(r"tools/screenshot_notebook\.py\s+(\S+)\s+(\S+)")


def _make_dry_run(*args):
    """(notebook, png) of every tool call ``make -n <args>`` would run, from a clean environment."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SCREENSHOT") and k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHON")}
    out = subprocess.run([make, "-n", *args], cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    calls = _TOOL_CALL.findall(out)
    assert calls, out
    return calls


def _git(*args):
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)


def _need_git_checkout():
    if shutil.which("git") is None:
        pytest.skip("no git")
    r = _git("rev-parse", "--show-toplevel")
    if r.returncode != 0 or Path(r.stdout.strip()).resolve() != REPO.resolve():
        pytest.skip("not a git checkout of the repository")


def _assert_ignored_untracked(png):
    path = Path(png)
    assert not path.is_absolute(), f"default output {png} is outside the checkout"
    assert path.suffix == ".png"
    # not tracked: a tracked default would leave the checkout dirty after every run
    tracked = _git("ls-files", "--error-unmatch", "--", png)
    assert tracked.returncode != 0, f"default output {png} is a tracked file"
    # and git-ignored, so a run does not even leave an untracked file behind
    ignored = _git("check-ignore", "-q", "--no-index", "--", png)
    assert ignored.returncode == 0, f"default output {png} is not git-ignored (add its folder to .gitignore)"


def test_make_screenshot_default_output_is_ignored_not_tracked():
    _need_git_checkout()
    [(nb, png)] = _make_dry_run("screenshot")
    assert nb == "notebooks/07_training.ipynb"
    _assert_ignored_untracked(png)
    # SCREENSHOT_NB picks the notebook (the PNG follows its name); SCREENSHOT_PNG still overrides
    [(nb, png)] = _make_dry_run("screenshot", "SCREENSHOT_NB=notebooks/01_foveated_knn_graph.ipynb")
    assert nb == "notebooks/01_foveated_knn_graph.ipynb" and Path(png).name == "01_foveated_knn_graph.png"
    _assert_ignored_untracked(png)
    [(nb, png)] = _make_dry_run("screenshot", "SCREENSHOT_PNG=/tmp/elsewhere.png")
    assert png == "/tmp/elsewhere.png"


def test_make_screenshots_covers_every_notebook_into_ignored_paths():
    _need_git_checkout()
    calls = _make_dry_run("screenshots")
    notebooks = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "notebooks").glob("*.ipynb"))
    assert [nb for nb, _ in calls] == notebooks
    assert len({png for _, png in calls}) == len(calls)
    for nb, png in calls:
        assert Path(png).stem == Path(nb).stem
        _assert_ignored_untracked(png)


# --- end to end, in a real browser ---------------------------------------------------------------

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
        nbformat.v4.new_code_cell("go.Figure()"),  # a figure with nothing in it
        # far more than one window of output (150 lines: over 2000 px), then the error and a last cell
        nbformat.v4.new_code_cell("for i in range(150):\n    print('line', i)"),
        nbformat.v4.new_code_cell("1 / 0"),
        nbformat.v4.new_markdown_cell("## the last cell"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "shot.ipynb"
    nbformat.write(nb, path)
    before = path.read_bytes()
    png = tmp_path / "out" / "shot.png"
    window = 800
    report = tool.screenshot_notebook(path, png, timeout=180, full_page=True, height=window)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert report["cells"] == report["executed"] == 5
    assert report["plots"] == 2 and report["widgets"] >= 1
    assert report["notebook_unchanged"] and path.read_bytes() == before
    # the failing cell is found, so the run is not ok
    assert any("ZeroDivisionError" in e for e in report["errors"]), report["errors"]
    assert report["ok"] is False
    # so is the empty figure
    assert report["empty_plots"] == 1 and any("no data" in m for m in report["missing"]), report["missing"]
    # the whole notebook, not one window: the PNG is as tall as the notebook and reaches its last cell
    fp = report["full_page"]
    width, height = tool.png_size(png)
    assert report["png_size"] == [width, height] == fp["png_size"]
    assert height == fp["window_height"] >= fp["notebook_height"] > 2000 > window, fp
    assert fp["last_cell_in_png"] and fp["last_cell_bottom"] <= height and not fp["cut"], fp


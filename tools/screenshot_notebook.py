#!/usr/bin/env python
"""Open a notebook in JupyterLab the way a new user would, run every cell, and take a screenshot.

    python tools/screenshot_notebook.py notebooks/07_training.ipynb build/screenshots/07_training.png

(``make screenshot`` / ``make screenshots`` write under the git-ignored ``build/screenshots/``.)
What it does, in order:

1. starts ``jupyter lab`` headless on a free localhost port with a random token, in a throw-away
   settings/workspace/runtime directory (autosave off, notebook windowing off, no scrolling past the
   last cell, no news or update checks), serving the repository root so notebooks can use relative
   paths;
2. opens the notebook in headless Chromium (the system's browser, driven by Python ``playwright``;
   no browser is downloaded), waits for the kernel, and runs *Run > Run All Cells* from the menu;
3. waits until every code cell has run, then for a plotly plot and a widget to render (each can be
   switched off, or required only where the stored notebook shows one: ``--require-stored``);
4. writes a PNG of the *whole* notebook: JupyterLab's notebook scrolls inside its own element, not
   the window, so a full-page screenshot of the window would still show one screen. The tool grows
   the browser window until that element has nothing left to scroll (every cell laid out on the
   page at once; windowing is off), scrolls it to the top, and screenshots the window; it then checks
   that the last cell ends inside the picture. ``--viewport`` gives a one-screen picture
   (scrolled to the first plot). A notebook taller than ``--max-height`` pixels is cut there and
   reported as a problem;
5. checks the page for error output (a ``Traceback``, a failed widget or plot) and for a plotly
   figure with no data in it, and exits 1 if it finds any (the PNG is still written, so you can look
   at what went wrong);
6. shuts the server down and verifies the notebook file on disk is byte-for-byte unchanged.

Needs: ``pip install playwright`` (the Python package only; do *not* run ``playwright install``)
and a Chromium binary (Debian: ``apt-get install chromium``). Exit codes: 0 ok, 1 errors on the page
or something did not render, 2 could not run (no browser, server did not start, timeout).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent

#: Chromium flags that work on a headless Linux box without a sandbox or a GPU.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "chromium", "chromium-browser",
                       "google-chrome")

#: Page text that means something failed.
ERROR_MARKERS = ("Traceback (most recent call last)", "Error displaying widget", "Javascript Error",
                 "Failed to display", "Model not found")

# JupyterLab user settings for a reproducible, quiet session.
_LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    # windowing off: every cell is in the page (not only those on screen); no blank screen after the
    # last cell (its height follows the window's, so a window grown to the notebook would grow it too)
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none", "scrollPastEnd": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
}


class ScreenshotError(RuntimeError):
    """The tool could not run (exit code 2)."""


def find_chromium(explicit: Optional[str] = None) -> Optional[str]:
    """Path of a Chromium binary: ``explicit``, ``$CHROMIUM``, then the usual names; None if absent."""
    for cand in ([explicit] if explicit else []) + [os.environ.get("CHROMIUM", "")] + list(CHROMIUM_CANDIDATES):
        if not cand:
            continue
        path = cand if os.path.isabs(cand) else shutil.which(cand)
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def playwright_available() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except Exception:
        return False
    return True


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def jupyter_lab(root: Path, workdir: Path, log_path: Path, timeout: float = 120.0):
    """Run ``jupyter lab`` on a free port; yields ``(base_url, token)``; stops it on exit."""
    port, token = free_port(), secrets.token_hex(16)
    settings = workdir / "lab-settings"
    for rel, value in _LAB_SETTINGS.items():
        f = settings / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))
    env = dict(os.environ)
    env.update({
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(workdir / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    })
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly", "--ServerApp.terminals_enabled=False",
           # checkpoints (written when a notebook is opened) go to the throw-away folder, not the repo
           f"--FileCheckpoints.root_dir={workdir / 'checkpoints'}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers often run as root
        cmd.append("--allow-root")
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(root))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise ScreenshotError(f"jupyter lab exited with code {proc.returncode}; see {log_path}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ScreenshotError(f"jupyter lab did not answer within {timeout:.0f} s; see {log_path}")
            time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


# a rendered plotly figure (the class sits on the output element itself in JupyterLab 4) and a
# rendered ipywidget (a box or a button; a widget without a live kernel shows only its text repr)
_PLOT = ".jp-Notebook .js-plotly-plot"
_WIDGET = ".jp-Notebook .jp-OutputArea-output .jupyter-widgets.widget-box, .jp-Notebook .jp-OutputArea-output .widget-button"
_IDLE = ".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']"
_JS_PROMPTS = """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt'))
    .map(e => e.textContent.trim())"""
_JS_OUTPUT_TEXT = """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-OutputArea-output'))
    .map(e => e.innerText || '')"""
# plotly figures with no data: no trace carries any data array (or scalar, e.g. an indicator's value)
# and the layout has no image. Plotly keeps the figure on the element: _fullData (after defaults,
# typed arrays decoded), else data.
_JS_EMPTY_PLOTS = """() => {
  const keys = ['x', 'y', 'z', 'values', 'labels', 'ids', 'lat', 'lon', 'locations', 'r', 'theta', 'a', 'b',
                'open', 'high', 'low', 'close', 'u', 'v', 'w', 'i', 'j', 'k', 'dimensions', 'cells', 'header',
                'node', 'link', 'source', 'value', 'geojson'];
  const has = v => v !== null && v !== undefined && (typeof v !== 'object' ||
      (typeof v.length === 'number' ? v.length > 0 : Object.keys(v).length > 0));
  return Array.from(document.querySelectorAll('.jp-Notebook .js-plotly-plot')).filter(gd => {
    const traces = gd._fullData || gd.data || [];
    const images = (gd._fullLayout || gd.layout || {}).images || [];
    return !traces.some(t => keys.some(k => has(t[k]))) && images.length === 0;
  }).length;
}"""
# The element the notebook scrolls in (JupyterLab 4: the windowed list's outer node), measured: how
# much is hidden below, where the last cell ends, the window's height. ``top``: scroll it to the top.
_JS_MEASURE = """(top) => {
  const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook')
      || document.querySelector('.jp-Notebook');
  if (!nb) return null;
  const boxes = [nb.querySelector('.jp-WindowedPanel-outer'), nb, nb.closest('.jp-NotebookPanel'),
                 document.scrollingElement].filter(Boolean);
  if (top) boxes.forEach(e => { e.scrollTop = 0; });
  const hidden = Math.max(...boxes.map(e => e.scrollHeight - e.clientHeight));
  const scroller = boxes.reduce((a, e) => (e.scrollHeight > a.scrollHeight ? e : a));
  const cells = nb.querySelectorAll('.jp-Cell');
  const last = cells.length ? cells[cells.length - 1].getBoundingClientRect() : null;
  const first = cells.length ? cells[0].getBoundingClientRect() : null;
  return {hidden: hidden, content: nb.querySelector('.jp-WindowedPanel-outer') ?
            nb.querySelector('.jp-WindowedPanel-outer').scrollHeight : scroller.scrollHeight,
          cells: cells.length, first_top: first ? first.top : null, last_bottom: last ? last.bottom : null,
          window: window.innerHeight};
}"""
_JS_TWO_FRAMES = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))"


def png_size(path: Path):
    """(width, height) of a PNG, read from its header (no imaging library needed)."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def stored_outputs(notebook: Path) -> Dict[str, int]:
    """How many plotly figures and widget views the notebook file itself shows (its stored outputs)."""
    counts = {"plots": 0, "widgets": 0}
    try:
        cells = json.loads(Path(notebook).read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return counts
    for cell in cells:
        for out in cell.get("outputs", []) or []:
            data = out.get("data", {}) or {}
            counts["plots"] += "application/vnd.plotly.v1+json" in data
            counts["widgets"] += "application/vnd.jupyter.widget-view+json" in data
    return counts


def _capture_full_page(page, out_png: Path, width: int, height: int, max_height: int) -> Dict:
    """Grow the window until the notebook has nothing left to scroll, then screenshot the window.

    Returns ``full_page`` facts for the report: the window height used, the notebook's content
    height, where the last cell ends, ``last_cell_in_png`` and ``cut`` (taller than ``max_height``).
    """
    view_h, cut = height, False
    m = page.evaluate(_JS_MEASURE, True)
    for _ in range(8):  # the layout can settle in steps (outputs reflow as the panel grows)
        if m is None or m["hidden"] <= 1:
            break
        want = view_h + int(m["hidden"]) + 1
        if want > max_height:
            want, cut = max_height, True
        if want == view_h:
            break
        view_h = want
        page.set_viewport_size({"width": width, "height": view_h})
        page.evaluate(_JS_TWO_FRAMES)
        time.sleep(0.5)  # Lumino lays the panels out on its own message loop
        m = page.evaluate(_JS_MEASURE, True)
    time.sleep(0.5)  # plots and widgets that listen to window resizes redraw
    m = page.evaluate(_JS_MEASURE, True) or {}
    page.screenshot(path=str(out_png))
    w, h = png_size(out_png)
    last = m.get("last_bottom")
    return {"window_height": view_h, "notebook_height": m.get("content"), "hidden_below": m.get("hidden"),
            "last_cell_bottom": last, "png_size": [w, h], "cut": cut,
            "last_cell_in_png": bool(last is not None and 0 < last <= h and (m.get("hidden") or 0) <= 1
                                     and (m.get("first_top") or 0) >= 0)}


def _menu(page, menu: str, commands) -> None:
    """Open the main menu ``menu`` and click the first item bound to one of ``commands``."""
    page.click(f".lm-MenuBar-item:has-text('{menu}')")
    page.click(", ".join(f".lm-Menu-item[data-command='{c}']" for c in commands))


def _accept_kernel_dialog(page) -> None:
    """Accept a "Select Kernel" dialog (the notebook's own kernel is preselected) if one is open."""
    dialog = page.query_selector(".jp-Dialog:has-text('Select Kernel')")
    if dialog is not None:
        button = dialog.query_selector(".jp-Dialog-button.jp-mod-accept")
        if button is not None:
            button.click()
            page.wait_for_selector(".jp-Dialog", state="detached")


def screenshot_notebook(notebook: Path, out_png: Path, *, chromium: Optional[str] = None, timeout: float = 300.0,
                        width: int = 1280, height: int = 1500, wait_plot: bool = True, wait_widget: bool = True,
                        scroll_to: str = "plot", keep_logs: bool = False, full_page: bool = True,
                        max_height: int = 40000, require_stored: bool = False) -> Dict:
    """Run ``notebook`` in JupyterLab in headless Chromium and write a PNG; returns a report dict.

    ``full_page`` (default): the PNG shows the whole notebook, every cell (the window is grown to the
    notebook's height, at most ``max_height`` pixels); otherwise one ``width`` x ``height`` window
    scrolled to ``scroll_to``. ``require_stored``: wait for (and require) a plot / a widget only
    where the notebook file's stored outputs show one (``wait_plot`` / ``wait_widget`` still switch
    each off).

    Report keys: ``cells`` (code cells), ``executed`` (cells with an execution count), ``plots``,
    ``widgets``, ``empty_plots`` (plotly figures without data), ``errors`` (list of error snippets),
    ``png_size`` ([width, height] of the PNG), ``full_page`` (window height, notebook height, where
    the last cell ends, ``last_cell_in_png``, ``cut``), ``missing`` (problems other than error
    output), ``seconds``, ``png``, ``ok``. Raises :class:`ScreenshotError` when it cannot run at all.
    """
    from playwright.sync_api import Error as PWError
    from playwright.sync_api import TimeoutError as PWTimeout
    from playwright.sync_api import sync_playwright

    notebook = Path(notebook).resolve()
    out_png = Path(out_png).resolve()
    if not notebook.is_file():
        raise ScreenshotError(f"notebook: {notebook} does not exist")
    exe = find_chromium(chromium)
    if exe is None:
        raise ScreenshotError("no Chromium found (apt-get install chromium, or pass --chromium PATH)")
    try:
        rel = notebook.relative_to(REPO)
        root = REPO
    except ValueError:
        root, rel = notebook.parent, Path(notebook.name)
    if require_stored:
        stored = stored_outputs(notebook)
        wait_plot, wait_widget = wait_plot and stored["plots"] > 0, wait_widget and stored["widgets"] > 0
    before = _sha256(notebook)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    report: Dict = {"notebook": str(rel), "png": str(out_png), "errors": []}
    work = Path(tempfile.mkdtemp(prefix="fovi-shot-"))
    try:
        with jupyter_lab(root, work, work / "jupyter.log") as (base, token), sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                str(work / "chromium-profile"), executable_path=exe, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": width, "height": height})
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            step = "loading JupyterLab"
            try:
                page.set_default_timeout(timeout * 1000)
                console_errors: List[str] = []
                page.on("pageerror", lambda exc: console_errors.append(str(exc)[:300]))
                page.goto(f"{base}/lab/tree/{rel.as_posix()}?token={token}&reset", wait_until="domcontentloaded")
                step = "waiting for the notebook to open"
                page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell")
                step = "waiting for the kernel to start"
                deadline = time.monotonic() + timeout
                while page.query_selector(_IDLE) is None:  # a "Select Kernel" dialog can come first
                    _accept_kernel_dialog(page)
                    if time.monotonic() > deadline:
                        raise ScreenshotError(f"the kernel did not start within {timeout:.0f} s")
                    time.sleep(0.5)
                _accept_kernel_dialog(page)
                step = "clearing the stored outputs"
                # Edit > Clear Outputs of All Cells, so stored outputs and counts cannot pass for fresh ones
                for attempt in range(3):  # the menu acts on the focused notebook: focus it first
                    _accept_kernel_dialog(page)
                    page.click(".jp-NotebookPanel .jp-Notebook .jp-Cell .jp-InputPrompt")
                    page.keyboard.press("Escape")  # command mode
                    _menu(page, "Edit", ("editmenu:clear-all", "notebook:clear-all-cell-outputs"))
                    try:
                        page.wait_for_function(f"({_JS_PROMPTS})().every(p => !/[0-9]/.test(p))", timeout=15000)
                        break
                    except PWTimeout:
                        page.keyboard.press("Escape")  # close a menu left open
                        if attempt == 2:
                            raise ScreenshotError("Clear Outputs of All Cells did nothing (three tries)") from None
                step = "starting Run All Cells"
                for attempt in range(3):  # a slow kernel start can swallow the first click (a dialog pops up)
                    _accept_kernel_dialog(page)
                    _menu(page, "Run", ("runmenu:run-all", "notebook:run-all-cells"))
                    try:
                        page.wait_for_function(f"({_JS_PROMPTS})().some(p => /[0-9*]/.test(p))", timeout=20000)
                        break
                    except PWTimeout:
                        page.keyboard.press("Escape")
                        if attempt == 2:
                            raise ScreenshotError("Run All Cells started nothing (three tries)") from None
                step = "running the cells"
                # finished: no prompt shows '*' (queued or running) and the kernel is idle, twice in a row
                # (after an error JupyterLab drops the rest of the queue: those prompts stay empty)
                quiet = 0
                while True:
                    _accept_kernel_dialog(page)
                    prompts = page.evaluate(_JS_PROMPTS)
                    idle = page.query_selector(_IDLE)
                    quiet = quiet + 1 if (idle is not None and not any("*" in p for p in prompts)) else 0
                    if quiet >= 2:
                        break
                    if time.monotonic() > deadline:
                        raise ScreenshotError(f"cells still running after {timeout:.0f} s: prompts {prompts}")
                    time.sleep(1.0)
                report["cells"] = len(prompts)
                report["executed"] = sum(p.strip("[]: ").isdigit() for p in prompts)
                step = "waiting for a plot and a widget to render"
                remaining = min(60.0, max(5.0, deadline - time.monotonic())) * 1000  # outputs exist: they render fast
                try:
                    if wait_plot:
                        page.wait_for_selector(_PLOT + " .main-svg", timeout=remaining)
                    if wait_widget:
                        page.wait_for_selector(_WIDGET, timeout=remaining)
                except PWTimeout:
                    pass  # reported as missing below
                time.sleep(1.0)  # let plotly finish laying out
                report["plots"] = len(page.query_selector_all(_PLOT))
                report["widgets"] = len(page.query_selector_all(_WIDGET))
                report["empty_plots"] = page.evaluate(_JS_EMPTY_PLOTS)
                for text in page.evaluate(_JS_OUTPUT_TEXT):
                    for marker in ERROR_MARKERS:
                        if marker in text:
                            report["errors"].append(text.strip()[:400])
                            break
                report["page_errors"] = console_errors
                if full_page:
                    step = "taking the full-page screenshot"
                    report["full_page"] = _capture_full_page(page, out_png, width, height, max_height)
                    report["png_size"] = report["full_page"]["png_size"]
                else:
                    target = {"plot": _PLOT, "widget": _WIDGET}.get(scroll_to)
                    el = page.query_selector(target) if target else None
                    if el is not None:
                        # put the cell holding it near the top of the notebook's scroll area
                        el.evaluate("e => (e.closest('.jp-Cell') || e).scrollIntoView({block: 'start'})")
                        time.sleep(0.5)
                    page.screenshot(path=str(out_png))
                    report["png_size"] = list(png_size(out_png))
            except PWError as exc:
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(out_png))  # what the page looked like when it failed
                raise ScreenshotError(f"failed while {step} ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
                                      f"screenshot of that state: {out_png}") from None
            finally:
                ctx.close()
    finally:
        if keep_logs:
            report["workdir"] = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    after = _sha256(notebook)
    report["notebook_unchanged"] = before == after
    report["seconds"] = round(time.monotonic() - t0, 1)
    missing = []
    if wait_plot and not report.get("plots"):
        missing.append("no plotly plot rendered")
    if wait_widget and not report.get("widgets"):
        missing.append("no widget rendered")
    if report.get("executed") != report.get("cells"):
        missing.append("not every code cell ran")
    if report.get("empty_plots"):
        missing.append(f"{report['empty_plots']} plotly figure(s) with no data")
    fp = report.get("full_page")
    if fp is not None:
        if fp["cut"]:
            missing.append(f"the notebook is taller than --max-height {max_height}: the PNG is cut there")
        elif not fp["last_cell_in_png"]:
            missing.append("the PNG does not reach the notebook's last cell")
    if not report["notebook_unchanged"]:
        missing.append("the notebook file changed on disk")
    report["missing"] = missing
    report["ok"] = not report["errors"] and not missing
    return report


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebook", type=Path)
    ap.add_argument("png", type=Path, help="where to write the screenshot (PNG)")
    ap.add_argument("--chromium", default=None, help="Chromium binary (default: /usr/bin/chromium or $CHROMIUM)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run (default 300)")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=1500,
                    help="window height; in full-page mode the starting height (the window grows to the notebook)")
    ap.add_argument("--viewport", action="store_true",
                    help="one window (--width x --height, scrolled to --scroll-to), not the whole notebook")
    ap.add_argument("--max-height", type=int, default=40000,
                    help="tallest full-page PNG in pixels (default 40000); a taller notebook is cut and reported")
    ap.add_argument("--scroll-to", choices=["plot", "widget", "top"], default="plot", help="with --viewport")
    ap.add_argument("--no-plot", action="store_true", help="do not require a plotly plot")
    ap.add_argument("--no-widget", action="store_true", help="do not require a widget")
    ap.add_argument("--require-stored", action="store_true",
                    help="require a plot / a widget only where the notebook's stored outputs show one")
    ap.add_argument("--keep-logs", action="store_true", help="keep the temporary folder (jupyter.log)")
    args = ap.parse_args(argv)
    if not playwright_available():
        print("screenshot: the Python package 'playwright' is not installed (pip install playwright; "
              "no 'playwright install' needed, the system Chromium is used)", file=sys.stderr)
        return 2
    try:
        report = screenshot_notebook(args.notebook, args.png, chromium=args.chromium, timeout=args.timeout,
                                     width=args.width, height=args.height, wait_plot=not args.no_plot,
                                     wait_widget=not args.no_widget, scroll_to=args.scroll_to,
                                     keep_logs=args.keep_logs, full_page=not args.viewport,
                                     max_height=args.max_height, require_stored=args.require_stored)
    except ScreenshotError as exc:
        print(f"screenshot: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    if not report["ok"]:
        print("screenshot: problems: " + "; ".join(report["missing"] + [f"{len(report['errors'])} error output(s)"]),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

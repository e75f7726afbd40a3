#!/usr/bin/env python
"""Open a notebook in JupyterLab the way a new user would, run every cell, and take a screenshot.

    python tools/screenshot_notebook.py notebooks/05_training.ipynb data/screenshots/05_training.png

What it does, in order:

1. starts ``jupyter lab`` headless on a free localhost port with a random token, in a throw-away
   settings/workspace/runtime directory (autosave off, notebook windowing off, no news or update
   checks), serving the repository root so notebooks can use relative paths;
2. opens the notebook in headless Chromium (the system's browser, driven by Python ``playwright``;
   no browser is downloaded), waits for the kernel, and runs *Run > Run All Cells* from the menu;
3. waits until every code cell has run, then for a plotly plot and a widget to render (each can be
   switched off), scrolls to the first plot and writes a PNG to the path given;
4. checks the page for error output (a ``Traceback``, a failed widget or plot) and exits 1 if it
   finds any (the PNG is still written, so you can look at what went wrong);
5. shuts the server down and verifies the notebook file on disk is byte-for-byte unchanged.

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
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
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
                        scroll_to: str = "plot", keep_logs: bool = False) -> Dict:
    """Run ``notebook`` in JupyterLab in headless Chromium and write a PNG; returns a report dict.

    Report keys: ``cells`` (code cells), ``executed`` (cells with an execution count), ``plots``,
    ``widgets``, ``errors`` (list of error snippets), ``seconds``, ``png``, ``ok``. Raises
    :class:`ScreenshotError` when it cannot run at all.
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
                for text in page.evaluate(_JS_OUTPUT_TEXT):
                    for marker in ERROR_MARKERS:
                        if marker in text:
                            report["errors"].append(text.strip()[:400])
                            break
                report["page_errors"] = console_errors
                target = {"plot": _PLOT, "widget": _WIDGET}.get(scroll_to)
                el = page.query_selector(target) if target else None
                if el is not None:
                    # put the cell holding it near the top of the notebook's scroll area
                    el.evaluate("e => (e.closest('.jp-Cell') || e).scrollIntoView({block: 'start'})")
                    time.sleep(0.5)
                page.screenshot(path=str(out_png))
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
    ap.add_argument("--height", type=int, default=1500)
    ap.add_argument("--scroll-to", choices=["plot", "widget", "top"], default="plot")
    ap.add_argument("--no-plot", action="store_true", help="do not require a plotly plot")
    ap.add_argument("--no-widget", action="store_true", help="do not require a widget")
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
                                     keep_logs=args.keep_logs)
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

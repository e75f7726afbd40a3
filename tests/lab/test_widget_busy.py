"""Every widget callback of the lab says that it is at work (fovi_lab.lab.common.busy / live): a status line reads
"running ..." and the controls are disabled while it runs, and after it the controls are as they were and the line
says "done in X s", or the error, when the callback raised. Checked before, during (from inside the patched work)
and after, on the helper, on the panels the package builds (notebook 10's mma widget, the family explorer) and on
the notebooks, which wire their widgets only through the helper."""

import json
import re
from pathlib import Path

import plotly.graph_objects as go
import pytest

W = pytest.importorskip("ipywidgets")

from fovi_lab.lab import common as C                                  # noqa: E402
from fovi_lab.lab import family_explorer as fe                        # noqa: E402
from fovi_lab.lab import mma_viz as mv                                # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DONE = re.compile(r"^done in \d+\.\d s$")


def _state(panel):
    return panel.status.value, [w.disabled for w in panel.controls.values()]


def test_busy_disables_shows_and_restores():
    a, b, status = W.IntText(value=1), W.Dropdown(options=[1, 2], disabled=True), W.Label()
    with C.busy([a, b], status, "training"):
        during = (status.value, a.disabled, b.disabled)
    assert during == ("training ...", True, True)
    assert DONE.match(status.value) and a.disabled is False and b.disabled is True   # each as it was


def test_busy_on_an_error_restores_says_why_and_raises():
    a, status = W.IntText(value=1), W.Label()
    with pytest.raises(ValueError, match="boom"):
        with C.busy([a, W.Output()], status):                        # an Output has no disabled: left alone
            raise ValueError("boom\nsecond line")
    assert a.disabled is False
    assert re.match(r"^stopped after \d+\.\d s by ValueError: boom$", status.value)


def test_live_runs_at_once_and_on_each_change():
    seen = []
    x, y = W.IntText(value=3), W.Dropdown(options=["a", "b"], value="a")

    def work(x, y):
        seen.append((x, y, _state(panel)))
        print(f"x = {x}")
        return x * 2

    panel = None
    panel = C.live(work, dict(x=x, y=y), run_now=False)
    assert _state(panel) == ("", [False, False]) and panel.last is None        # before
    panel.run()
    x.value = 5                                                                # what typing a number does
    assert [s[:2] for s in seen] == [(3, "a"), (5, "a")]
    assert all(s[2] == ("running ...", [True, True]) for s in seen)            # during
    assert DONE.match(panel.status.value) and _state(panel)[1] == [False, False]  # after
    assert panel.last == 10 and x.description == "x"                           # labelled as interact labels


def test_live_on_an_error_shows_one_line_and_frees_the_controls(capsys):
    seen = []

    def work(n):
        seen.append(_state(panel))
        raise RuntimeError("no kernel for that\ntraceback noise")

    panel = None
    panel = C.live(work, dict(n=W.IntSlider(value=2)), button="Run", run_now=False, doing="training")
    assert panel.button.disabled is False
    panel.button.click()                                                       # what a press does
    assert seen == [("training ...", [True])]
    assert panel.button.disabled is False and _state(panel)[1] == [False]
    assert panel.status.value.endswith("by RuntimeError: no kernel for that")
    assert "could not run: RuntimeError: no kernel for that" in capsys.readouterr().out
    assert "traceback noise" not in panel.status.value


def test_the_mma_widget_says_it_is_running(monkeypatch):
    seen, fail = [], {}

    def explore(layer, batch, config, device=None):
        seen.append((batch, _state(panel) if panel else None))
        if fail:
            raise MemoryError("out of host memory")
        return [f"ran B = {batch}"], go.Figure()

    panel = None
    monkeypatch.setattr(mv, "explore_mma_widget", explore)
    panel = mv.mma_widget("alex_L0", batch=16, device="cpu")                  # the first run, at once
    assert DONE.match(panel.status.value) and _state(panel)[1] == [False] * 3
    slider = panel.children[0].children[1]
    slider.value = 32
    assert seen[-1] == (32, ("running ...", [True] * 3)) and panel.last[0] == ["ran B = 32"]
    fail["now"] = True
    slider.value = 48
    assert seen[-1] == (48, ("running ...", [True] * 3))
    assert panel.status.value.endswith("by MemoryError: out of host memory") and _state(panel)[1] == [False] * 3
    assert panel.last[0] == ["ran B = 32"]                                     # the last good run stays


def test_the_family_explorer_says_it_is_running(monkeypatch):
    seen = []

    def explore(family, layer, batch, device=None, log=None, **params):
        seen.append((panel.status.value if panel else None,
                     [w.disabled for w in panel.children[0].children] if panel else None))
        if batch == 13:
            raise ValueError("thirteen")
        return dict(ok=True, passed=True, message=f"B = {batch}"), go.Figure()

    panel = None
    monkeypatch.setattr(fe, "explore_point", explore)
    panel = fe.family_widget("simt", "res18_layer1", 8, device="cpu")
    batch = panel.children[0].children[2]
    batch.value = 9
    assert seen[-1] == ("running ...", [True, True, True]) and DONE.match(panel.status.value)
    assert panel.last_result["message"] == "B = 9"
    batch.value = 13
    assert panel.status.value.endswith("by ValueError: thirteen")
    assert [w.disabled for w in panel.children[0].children] == [False] * 3
    assert all(not w.disabled for w in panel.children[1].children)             # the parameters' dropdowns too


def _code_cells():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                yield path.name, "".join(cell["source"])


def test_the_notebooks_wire_widgets_only_through_the_helper():
    """A notebook's widget runs through kl.live (or a package panel built on it): no bare interact, on_click or
    observe, whose callbacks would run without a word."""
    bare = [(name, m.group(0)) for name, src in _code_cells()
            for m in re.finditer(r"\binteract(ive)?\(|\.on_click\(|\.observe\(", src)]
    assert bare == []
    assert sum(1 for _, src in _code_cells() if "live(" in src) >= 9


def test_every_package_callback_runs_under_busy():
    """Each module of the lab that hooks a callback to a widget runs it under busy (live does)."""
    for path in sorted((ROOT / "fovi_lab" / "lab").glob("*.py")):
        src = path.read_text()
        if re.search(r"\.on_click\(|\.observe\(|\binteract\(", src):
            assert "busy(" in src, path.name

"""The stored outputs of the notebooks do not record a broken explanation.

nbval compares a notebook's outputs with the ones stored in it, so an output that was wrong when the notebook
was last executed (a source listing whose marked lines had moved away) passes every later run. The lab
prints such a failure in words (:func:`fovi_lab.lab.show_source`, :func:`fovi_lab.lab.missing_marks`); this
test reads the stored outputs for them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def _stream_text(path: Path):
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain") or ""
            yield i, "".join(text) if isinstance(text, list) else text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_source_listing_lost_its_marked_lines(path):
    bad = [(i, line) for i, text in _stream_text(path) for line in text.splitlines()
           if "points at lines that are no longer here" in line
           or ("every line the text points at is still in the source" in line and not line.endswith("True"))]
    assert bad == []


def test_the_check_reads_the_lab_s_own_words():
    from fovi_lab import lab
    text = lab.show_source(lab.setup, {"no such line in setup": "x"})
    assert "points at lines that are no longer here" in text


_DATA_KEYS = ("y", "x", "z", "values", "r", "cells")


def _finite(v) -> bool:
    """Whether a trace field holds at least one finite number (nested lists and plotly's typed arrays too)."""
    if isinstance(v, bool) or v is None:
        return False
    if isinstance(v, (int, float)):
        return v == v and v not in (float("inf"), float("-inf"))
    if isinstance(v, dict):                       # {"dtype": ..., "bdata": ...}: plotly's binary arrays
        return bool(v.get("bdata")) or any(_finite(x) for x in v.values() if isinstance(x, (list, dict)))
    if isinstance(v, (list, tuple)):
        return any(_finite(x) for x in v)
    return False


def _figures(path: Path):
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        for out in cell.get("outputs", []):
            fig = out.get("data", {}).get("application/vnd.plotly.v1+json")
            if fig is not None:
                yield i, fig


def empty_traces(fig: dict):
    """The names of a stored plotly figure's traces with no finite number in any data field."""
    bad = []
    for t in fig.get("data", []):
        fields = [t.get(k) for k in _DATA_KEYS if k in t]
        if t.get("type") == "table":
            fields = [t.get("cells", {}).get("values")]
        if not any(_finite(f) for f in fields):
            bad.append(t.get("name") or t.get("type") or "?")
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_figure_shows_data(path):
    """Every trace of every figure a notebook shows has finite data, and no figure is a bare message: an empty
    figure passes nbval (it compares no plot data), so this reads the stored outputs."""
    bad = []
    for i, fig in _figures(path):
        if not fig.get("data"):
            texts = [a.get("text", "") for a in fig.get("layout", {}).get("annotations", [])]
            bad.append((i, "no traces", texts[:1]))
        elif empty_traces(fig):
            bad.append((i, empty_traces(fig)[:3]))
    assert bad == []


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


def figure_labels(fig: dict):
    """``(where, text)`` for every label a reader sees in a stored plotly figure: the title, axis titles and tick
    texts, annotations, trace names, categorical axis values, a table's header and cells, and a trace's text
    where it is drawn (a scatter's text mode, a heat map's cell texts; not hover texts, which may carry the config
    id beside the words)."""
    layout = fig.get("layout", {})
    for key, value in layout.items():
        if key == "title" or key.startswith(("xaxis", "yaxis")):
            title = value.get("title") if isinstance(value, dict) and key != "title" else value
            for text in _strings(title):
                yield key, text
            if isinstance(value, dict):
                for text in _strings(value.get("ticktext")):
                    yield key + " ticks", text
    for ann in layout.get("annotations", []) or []:
        yield "annotation", ann.get("text", "")
    for t in fig.get("data", []):
        yield "trace name", t.get("name") or ""
        if t.get("type") == "table":
            for text in _strings([t.get("header", {}).get("values"), t.get("cells", {}).get("values")]):
                yield "table", text
            continue
        for axis in ("x", "y"):
            values = t.get(axis)
            if isinstance(values, list) and values and isinstance(values[0], str):
                for text in values:
                    yield axis + " categories", text
        if "text" in str(t.get("mode", "")) or t.get("texttemplate"):     # drawn: a scatter's or a heat map's cells
            for text in _strings(t.get("text")):
                yield "drawn text", text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_figure_labels_are_words_not_config_ids(path):
    """A learner reads tile shapes and kernel kinds in words on every axis, legend, annotation and table of a
    figure (fovi_lab.lab.labels); a config id (``mmato_o64b32b256``) may sit in a hover text only."""
    from fovi_lab.lab.labels import CONFIG_ID
    bad = sorted({(i, where, m) for i, fig in _figures(path) for where, text in figure_labels(fig)
                  for m in CONFIG_ID.findall(text)})
    assert bad == [], f"{path.name}: config ids in figure labels (cell, where, id): {bad[:8]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_log_axes_read_in_full_numbers(path):
    """A log axis of a stored figure sets its ticks (fovi_lab.lab.common.readable_log_axes: 0.02, 0.05, 0.1, ...),
    so it never shows plotly's digit-only minor labels ("2, 5, 0.1, 2, 5")."""
    bad = [(i, name) for i, fig in _figures(path) for name, axis in fig.get("layout", {}).items()
           if name.startswith(("xaxis", "yaxis")) and isinstance(axis, dict) and axis.get("type") == "log"
           and axis.get("tickvals") is None and axis.get("dtick") is None]
    assert bad == [], f"{path.name}: log axes without ticks of their own (cell, axis): {bad[:8]}"


#: A cell that prints a listing of the package's code (:func:`fovi_lab.lab.show_source`, ``inspect.getsource``, a
#: native ``*_snippet``): its string literals and docstrings are the config ids the code passes to the API, and a
#: learner reads them as code. The one place a printed config id may stand; a cell's source must call one of these.
_LISTING = re.compile(r"\b(?:show_source|getsource|\w+_snippet)\(")


def printed_texts(nb: dict):
    """``(cell, text)`` of every printed text output a learner reads (stdout and plain-text results), listings of the
    package's code (:data:`_LISTING`) left out."""
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code" or _LISTING.search("".join(cell["source"])):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                continue
            text = out.get("text") or out.get("data", {}).get("text/plain") or ""
            yield i, "".join(text) if isinstance(text, list) else text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_printed_tables_name_kernels_in_words(path):
    """Every table and line a notebook prints names a kernel in words (fovi_lab.lab.labels.kernel_label /
    short_label: ``tensor cores 64x32, x^T, staged store``), never by its config id (``mmato_o64b32b256``)."""
    from fovi_lab.lab.labels import CONFIG_ID
    bad = sorted({(i, m) for i, text in printed_texts(json.loads(path.read_text())) for m in CONFIG_ID.findall(text)})
    assert bad == [], f"{path.name}: config ids in printed outputs (cell, id): {bad[:8]}"


def test_the_printed_text_check_reads_outputs_and_spares_listings():
    from fovi_lab.lab.labels import CONFIG_ID

    def cell(src, text, kind="stream"):
        out = ({"output_type": "stream", "name": "stdout", "text": text} if kind == "stream"
               else {"output_type": "execute_result", "data": {"text/plain": text}})
        return {"cell_type": "code", "source": src, "outputs": [out]}
    nb = {"cells": [cell("print(table)", "B=16  mmato_o64b32b256  0.1 ms\n"), cell("rows", "['nm_m16n32k64']", "result"),
                    cell("print(kl.show_source(F.select_config))", 'return "m64n64r1b256"'),
                    cell("print(inspect.getsource(f))", '"gi2_p64b64"'),
                    cell("print(mma_pipe.pipe_snippet(128, 64))", "ldmatrix.m8n8"),
                    cell("print(words)", "B=16  tensor cores 64x32, x^T, staged store  0.1 ms")]}
    found = [(i, m) for i, text in printed_texts(nb) for m in CONFIG_ID.findall(text)]
    assert found == [(0, "mmato_o64b32b256"), (1, "nm_m16n32k64")]


def test_the_label_check_reads_legends_axes_and_tables():
    from fovi_lab.lab.labels import CONFIG_ID
    fig = {"layout": {"xaxis": {"title": {"text": "time (ms)"}}, "annotations": [{"text": "rule: mma_o96b16k32"}]},
           "data": [{"type": "bar", "name": "m64n64r2", "x": ["gi2_p64b128", "tile"], "hovertext": ["mmat_o64b16"]},
                    {"type": "table", "header": {"values": ["config"]}, "cells": {"values": [["nm_m64n64k64"]]}}]}
    found = sorted(m for _, text in figure_labels(fig) for m in CONFIG_ID.findall(text))
    assert found == ["gi2_p64b128", "m64n64r2", "mma_o96b16k32", "nm_m64n64k64"]


def test_the_figure_check_finds_an_empty_trace():
    assert empty_traces({"data": [{"type": "bar", "name": "a", "y": [None, None]},
                                  {"type": "bar", "name": "b", "y": [1.0, None]}]}) == ["a"]
    assert empty_traces({"data": [{"type": "scatter", "y": {"dtype": "f8", "bdata": "AAAA"}}]}) == []


# A quoted measurement is a number with a unit of time, rate, size, ratio or share. "96 × 121" (a shape) is
# not one: a "×" or "x" followed by a number is a product.
_UNITS = r"ms|µs|us|ns|s|TFLOP/s|GFLOP/s|GB/s|TB/s|%|GiB|MiB|KiB|KB|MB|GB|x(?!\s*\d)|×(?!\s*\d)"
_NUM = r"\d+(?:,\d{3})*(?:\.\d+)?"
# a quote, or a range of two ("1.1-3.5x", "0.68–0.72 ms"): both ends are quotes
_QUOTED = re.compile(r"(?<![\w.§–-])(" + _NUM + r")(?:\s?[-–]\s?(" + _NUM + r"))?\s?(" + _UNITS + r")(?![\w/])")
_PRINTED = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?")


def _decimals(s: str) -> int:
    return len(s.split(".")[1]) if "." in s else 0


def _compared_numbers(nb: dict) -> list[tuple[float, int]]:
    """The numbers (value, decimals) in the text outputs nbval compares: code cells not tagged
    ``nbval-ignore-output`` (their output depends on the machine) or ``gpu`` (skipped without a GPU)."""
    nums = []
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] != "code" or "nbval-ignore-output" in tags or "gpu" in tags:
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                continue
            text = out.get("text") or out.get("data", {}).get("text/plain") or ""
            text = "".join(text) if isinstance(text, list) else text
            nums += [(float(m.group(0).replace(",", "")), _decimals(m.group(0)))
                     for m in _PRINTED.finditer(text)]
    return nums


def unprinted_quotes(nb: dict) -> list[tuple[int, str]]:
    """The measurements that a notebook's prose quotes and no compared output prints: (cell, quote). A quote
    is printed when some compared output prints a number with at least as many decimals that rounds to it."""
    printed = _compared_numbers(nb)
    bad = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for m in _QUOTED.finditer("".join(cell["source"])):
            for q in filter(None, m.group(1, 2)):
                value, dec = float(q.replace(",", "")), _decimals(q)
                if not any(d >= dec and abs(round(v, dec) - value) < 1e-9 for v, d in printed):
                    bad.append((i, m.group(0)))
                    break
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_quoted_number_is_printed(path):
    """Prose quotes a measurement only through a cell that prints it and that nbval compares: a number typed
    into the text goes stale the day the records change, and nothing would notice."""
    assert unprinted_quotes(json.loads(path.read_text())) == []


def test_the_quote_check_reads_units_and_rounding():
    def nb(md, out, tags=()):
        return {"cells": [{"cell_type": "markdown", "source": md},
                          {"cell_type": "code", "metadata": {"tags": list(tags)},
                           "outputs": [{"output_type": "stream", "name": "stdout", "text": out}]}]}
    assert unprinted_quotes(nb("it takes 0.42 ms, 1.3× the base", "0.4213 ms  ratio 1.27")) == []
    assert unprinted_quotes(nb("it takes 0.43 ms", "0.4213 ms")) == [(0, "0.43 ms")]
    assert unprinted_quotes(nb("it takes 0.42 ms", "0.4213 ms", ["nbval-ignore-output"])) == [(0, "0.42 ms")]
    assert unprinted_quotes(nb("a 96 × 121 tile, 16 KB, 7 %", "16 KB  7.0")) == []
    assert unprinted_quotes(nb("12.5 %", "12")) == [(0, "12.5 %")]
    assert unprinted_quotes(nb("1.1-3.5x and 0.68–0.72 ms", "1.1 3.5 0.68")) == [(0, "0.68–0.72 ms")]


_MAX_WORDS = 2500

# History in prose: the notebooks say what was measured and which record holds it, not how the package got here.
_HISTORY = re.compile(r"\b(?:now|no longer|previously|formerly|used to be|(?:that|they|which) replaced|replaced (?:these|them|it)"
                      r"|of that run|rule then|old rule|new rule|this session)\b", re.IGNORECASE)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_prose_tells_no_history(path):
    bad = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            bad += [(i, text[max(0, m.start() - 30):m.end() + 20].replace("\n", " ")) for m in _HISTORY.finditer(text)]
    assert bad == [], f"{path.name}: history in the prose (cell, words): {bad[:6]}"


def test_the_history_check_reads_the_phrases():
    found = [m.group(0) for m in _HISTORY.finditer("The default is now X, the kernels they replaced; under the rule of "
                                                    "that run. A kernel that runs a loop; unknown.")]
    assert found == ["now", "they replaced", "of that run"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_prose_fits_one_idea(path):
    """At most 2,500 words of prose per notebook: one idea, not a lab diary (the path lines, written from
    fovi_lab.lab.path, are navigation, not prose)."""
    from fovi_lab.lab.path import without_path_lines
    words = sum(len(without_path_lines("".join(c["source"])).split()) for c in json.loads(path.read_text())["cells"]
                if c["cell_type"] == "markdown")
    assert words <= _MAX_WORDS, f"{path.name}: {words} words of prose (at most {_MAX_WORDS})"


#: The notebooks whose stored figures keep to every layout check below: all of them.
LAYOUT_CHECKED = NOTEBOOKS


@pytest.mark.parametrize("path", LAYOUT_CHECKED, ids=lambda p: p.name)
def test_figures_read_cleanly(path):
    """No title clipped at the width a figure is laid out for (fovi_lab.lab.figure_layout.FIGURE_WIDTH), no
    horizontal legend on rotated tick labels or an axis title, no buttons or legend over a title or the plot, and
    every axis a reader sees titled: in words for categories, with its unit in brackets for numbers."""
    from fovi_lab.lab import figure_layout as fl
    bad = [(i, what) for i, fig in _figures(path)
           for what in fl.clipped_titles(fig) + fl.legend_over_ticks(fig) + fl.overlapping_boxes(fig)
           + fl.axes_without_units(fig)]
    assert bad == [], f"{path.name}: figures that do not read cleanly (cell, what): {bad[:8]}"


def _bars(labels, **layout):
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=("compile (s)", "run time (ms)"))
    fig.add_trace(go.Bar(x=labels, y=[1.0] * len(labels), name="compile"), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=[2.0] * len(labels), name="run"), row=2, col=1)
    fig.update_layout(height=420, margin=dict(l=10, r=10, t=60, b=10), **layout)
    return fig


def test_the_layout_checks_find_what_a_reader_cannot_read():
    from fovi_lab.lab import figure_layout as fl
    runs = [f"#{i} res18_layer1 B=64 gather tiles 32x64, r = 1" for i in range(1, 7)]
    message = "PASS  " + "tile GEMM over gathered rows, 32 rows x 64 channels per tile, " * 3 + "max error < 1e-3"
    # the whole message as the title, clipped on the right; a horizontal legend under rotated run labels
    fig = _bars(runs, title=message, legend=dict(orientation="h", y=-0.15))
    assert [w for w, _ in fl.clipped_titles(fig)] == ["title"]
    assert fl.legend_over_ticks(fig) == ["xaxis2: the legend (y = -0.15) is under rotated tick labels"]
    assert sorted(fl.axes_without_units(fig)) == [("xaxis2", ""), ("yaxis", ""), ("yaxis2", "")]
    # short numeric labels do not rotate, but a legend 8 % of the plot under them sits on their axis title
    fig = _bars(["1", "2"], legend=dict(orientation="h", y=-0.08))
    fig.update_xaxes(title_text="batch (rows)", row=2, col=1)
    assert len(fl.legend_over_ticks(fig)) == 1 and "on the tick labels or title" in fl.legend_over_ticks(fig)[0]
    # buttons in a row above the plot, on the top subplot title; a column beside the plot covers nothing
    fig = _bars(["a", "b"], updatemenus=kl_menu(["B = 1", "B = 16", "B = 64", "B = 128", "B = 256", "B = 512"]))
    assert ("subplot title 'compile (s)'", "buttons 0") in fl.overlapping_boxes(fig)
    fl.menu_beside(fig)
    assert fl.overlapping_boxes(fig) == []
    # a subplot title wider than its room; wrapped to it, it fits
    fig = _bars(["a"])
    fig.layout.annotations[0].text = "a subplot title far longer than any figure could hold on one line: " * 2
    assert [w for w, _ in fl.clipped_titles(fig)] == ["subplot title"]
    fl.fit_top(fig)
    assert fl.clipped_titles(fig) == [] and "<br>" in fig.layout.annotations[0].text
    # the fixed form of the first figure: a short title, the message wrapped under it, the legend above the plot
    fig = _bars(runs)
    text, lines = fl.wrapped_title("forward runs: PASS", message)
    fig.update_layout(title=fl.title_layout(text, lines, 420))
    fl.legend_above(fig, 420, title_lines=lines)
    assert fl.clipped_titles(fig) == [] and fl.legend_over_ticks(fig) == [] and fl.overlapping_boxes(fig) == []
    assert " ".join(message.split()) in fl.title_text(text)
    fig.update_layout(margin=dict(t=60))                     # a top margin too small for title and legend
    assert {("plot area", "title"), ("plot area", "legend")} <= set(fl.overlapping_boxes(fig))
    fig.update_yaxes(title_text="compile (s)", row=1, col=1)
    fig.update_yaxes(title_text="run time", row=2, col=1)
    fig.update_xaxes(title_text="run", row=2, col=1)
    assert fl.axes_without_units(fig) == [("yaxis2", "run time")]


def test_headed_lays_out_title_buttons_and_legend():
    """figure_layout.headed: a short title with its long message wrapped under it, the buttons beside the plot and
    the legend above it (or under the x axis), every check clean; an x axis of numbers without a unit is found."""
    from fovi_lab.lab import figure_layout as fl
    runs = [f"#{i} res18_layer1 B=64 gather tiles 32x64, r = 1" for i in range(1, 7)]
    message = "recorded on NVIDIA H200 · " + "every layer of the sweep, medians of the replays, " * 3
    fig = _bars(runs, updatemenus=kl_menu(["B = 16", "B = 64", "B = 512"]))
    fig.update_yaxes(title_text="compile (s)", row=1, col=1)
    fig.update_yaxes(title_text="run time (ms)", row=2, col=1)
    fig.update_xaxes(title_text="run (layer, batch, kernel)", row=2, col=1)
    top = fl.headed(fig, 520, "forward runs", message)
    assert fig.layout.title.text.startswith("forward runs<br><sub>") and fig.layout.margin.t == top
    assert " ".join(message.split()) in fl.title_text(fig.layout.title.text)
    assert fig.layout.legend.yref == "container" and fig.layout.updatemenus[0].xanchor == "left"
    assert fl.clipped_titles(fig) == [] and fl.legend_over_ticks(fig) == [] and fl.overlapping_boxes(fig) == []
    assert fl.axes_without_units(fig) == []
    fig = _bars([1, 2])
    fl.headed(fig, 420, "a short title", legend="below")
    assert fig.layout.legend.yanchor == "bottom" and fl.overlapping_boxes(fig) == []
    fig.update_xaxes(title_text="batch", row=2, col=1)
    assert ("xaxis2", "batch") in fl.axes_without_units(fig)
    assert fl.legend_px(fig) == fl.legend_rows(["compile", "run"], fl.FIGURE_WIDTH, 20) * 21


def kl_menu(labels):
    return [dict(buttons=[dict(label=label, method="update", args=[{}]) for label in labels], type="buttons",
                 direction="right", x=1.0, xanchor="right", y=1.1, active=0)]

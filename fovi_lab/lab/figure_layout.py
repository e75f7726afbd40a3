"""Figures that read cleanly: titles wrapped to the width they get, legends and buttons where they cover nothing,
and the checks that a figure (a ``go.Figure`` or the JSON a notebook stores) keeps to that.

No browser measures text here. Every size is an estimate from plotly's default fonts (Open Sans; 12 px text, 17 px
figure title, 16 px subplot titles, 14 px axis titles, 70 % size inside ``<sub>`` / ``<sup>``): a character is
:data:`CHAR_EM` of its font size, a little wider than Open Sans's average, so an estimate errs on the long side.
Every figure is laid out for :data:`FIGURE_WIDTH` pixels, the narrowest output area a notebook figure gets
(JupyterLab in a window of about 1000 px with its side bar open); a wider output area only adds room.

Builders: :func:`wrap_words`, :func:`wrapped_title` (a short title line and a long message under it),
:func:`fit_subplot_titles`, :func:`fit_top`, :func:`legend_rows`, :func:`legend_px`, :func:`legend_above`,
:func:`legend_below`, :func:`menu_beside`, and :func:`headed`, which lays out a figure with all of them.
Checks (each returns what it found wrong, ``[]`` for a clean figure): :func:`clipped_titles`,
:func:`legend_over_ticks`, :func:`overlapping_boxes`, :func:`axes_without_units`.
"""

from __future__ import annotations

import html
import json
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import plotly.graph_objects as go

__all__ = [
    "FIGURE_WIDTH", "CHAR_EM", "UNIT", "text_px", "wrap_words", "wrapped_title", "title_text", "title_px",
    "title_layout", "fit_subplot_titles", "fit_top", "subplot_title_px", "legend_rows", "legend_px", "legend_above",
    "legend_below", "menu_width", "menu_beside", "headed", "clipped_titles", "legend_over_ticks", "overlapping_boxes",
    "axes_without_units",
]

#: The width (px) every figure is laid out for and checked at.
FIGURE_WIDTH = 800
#: The width of one character as a share of its font size (Open Sans averages about 0.5 to 0.55 em).
CHAR_EM = 0.58

_FONT = 12            # plotly's text (ticks, legend, buttons)
_TITLE_FONT = 17      # the figure's title: 1.4 x the text
_SUBPLOT_FONT = 16    # make_subplots' subplot titles
_AXIS_FONT = 14       # axis titles
_SMALL = 0.7          # <sub> and <sup>
_LINE = 1.3           # plotly's line height, in font sizes
_LEGEND_ROW = 21      # one row of a horizontal legend
_LEGEND_SYMBOL = 40   # the symbol and gaps of one legend entry
_BUTTON_H = 26        # one button of an updatemenu
_BUTTON_PAD = 24      # a button's width beyond its label
_TITLE_PAD = 10       # the title's distance from the figure's top
_GAP = 8              # space between two stacked parts
_TICK_BAND = 22       # tick labels under (or beside) an axis
_DEFAULT_MARGIN = dict(l=80, r=80, t=100, b=80)

_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
_TAG = re.compile(r"</?[a-zA-Z][^<>]*>")
_SMALL_LINE = re.compile(r"^\s*<(sub|sup)>.*</\1>\s*$", re.IGNORECASE | re.DOTALL)


def text_px(text: str, font_px: float) -> float:
    """The estimated width (px) of one line of plain text at ``font_px``."""
    return len(text) * CHAR_EM * font_px


def _chars(width_px: float, font_px: float) -> int:
    return max(8, int(width_px / (CHAR_EM * font_px)))


def wrap_words(text: str, chars: int) -> List[str]:
    """``text`` broken at spaces into lines of at most ``chars`` characters (a longer word keeps a line of its own);
    runs of spaces count as one."""
    lines: List[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > chars:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(line)
    return lines


def _lines(text: str) -> List[Tuple[str, float]]:
    """``(plain text, size factor)`` of each line of a plotly title text: split at ``<br>``, tags dropped, entities
    read (``&lt;`` is ``<``); a line that is one ``<sub>`` or ``<sup>`` is drawn at 70 % size."""
    out = []
    for line in _BR.split(text or ""):
        scale = _SMALL if _SMALL_LINE.match(line) else 1.0
        out.append((html.unescape(_TAG.sub("", line)), scale))
    return out


def title_text(text: str) -> str:
    """What a reader reads in a plotly title text: its lines joined by spaces, tags dropped, entities read."""
    return " ".join(" ".join(line.split()) for line, _ in _lines(text) if line.strip())


def wrapped_title(main: str, message: Optional[str] = None, width: int = FIGURE_WIDTH,
                  margin_l: int = 10) -> Tuple[str, int]:
    """``(text, lines)``: the title ``main`` (wrapped if it must be) with ``message`` under it in small type, wrapped
    to the width the title gets (it starts at 5 % of the figure), ``<`` and ``>`` written as entities so plotly does
    not read them as tags; ``lines`` is the number of lines drawn."""
    room = width * 0.95 - margin_l
    head = wrap_words(main, _chars(room, _TITLE_FONT))
    sub = wrap_words(message, _chars(room, _TITLE_FONT * _SMALL)) if message else []
    parts = [html.escape(line, quote=False) for line in head]
    parts += [f"<sub>{html.escape(line, quote=False)}</sub>" for line in sub]
    return "<br>".join(parts), len(parts)


def title_px(lines: int) -> int:
    """The height (px) from the figure's top to the bottom of a title of ``lines`` lines (:func:`title_layout`)."""
    return int(_TITLE_PAD + lines * _LINE * _TITLE_FONT + 4) if lines else 0


def title_layout(text: str, lines: int, height: int) -> dict:
    """The ``title`` of a layout: ``text`` at the figure's top left (container coordinates, so it stays where
    :func:`title_px` says whatever the margins do)."""
    return dict(text=text, x=0.05, xanchor="left", xref="container", y=1 - _TITLE_PAD / height, yanchor="top",
                yref="container")


def _subplot_titles(layout: dict) -> List[dict]:
    """The annotations make_subplots draws as subplot titles (centred above a subplot, in paper coordinates)."""
    return [a for a in layout.get("annotations", []) or []
            if a.get("xref", "paper") == "paper" and a.get("yref", "paper") == "paper"
            and a.get("xanchor") == "center" and a.get("yanchor") == "bottom" and a.get("showarrow") is False]


def _margin(layout: dict) -> Dict[str, float]:
    m = dict(_DEFAULT_MARGIN)
    m.update({k: v for k, v in (layout.get("margin") or {}).items() if k in m and v is not None})
    return m


def _room(centres: Sequence[float], i: int, x: float, width: float) -> float:
    """The width (px) a title centred at ``x`` (px) may take: to neither figure edge nor half way to a neighbour."""
    room = 2 * min(x, width - x)
    for j, c in enumerate(centres):
        if j != i and c != x:
            room = min(room, abs(c - x))
    return room


def _title_centres(fig: dict, width: float) -> Tuple[List[dict], List[float]]:
    layout = fig.get("layout", {})
    m = _margin(layout)
    anns = _subplot_titles(layout)
    centres = [m["l"] + float(a.get("x", 0.5)) * (width - m["l"] - m["r"]) for a in anns]
    return anns, centres


def fit_subplot_titles(fig: go.Figure, width: int = FIGURE_WIDTH) -> go.Figure:
    """``fig`` with each line of each subplot title wrapped at spaces to the room it has at ``width``
    (:func:`clipped_titles` checks the same room): no figure edge clips it and it does not run into the title beside
    it. A ``<br>`` the title has already stays a line break."""
    d = _as_dict(fig)
    anns, centres = _title_centres(d, width)
    rows = _rows(anns)
    texts = {}
    for i, a in enumerate(anns):
        same = [centres[j] for j in rows[round(float(a.get("y", 1)), 3)]]
        room = _room(same, same.index(centres[i]), centres[i], width)
        chars = _chars(room, _SUBPLOT_FONT)
        lines = [w for line, _ in _lines(a.get("text", "")) for w in wrap_words(line, chars)]
        texts[(a.get("x"), a.get("y"), a.get("text"))] = "<br>".join(html.escape(w, quote=False) for w in lines)
    for ann in fig.layout.annotations:
        key = (ann.x, ann.y, ann.text)
        if key in texts:
            ann.text = texts[key]
    return fig


def _rows(anns: List[dict]) -> Dict[float, List[int]]:
    rows: Dict[float, List[int]] = {}
    for i, a in enumerate(anns):
        rows.setdefault(round(float(a.get("y", 1)), 3), []).append(i)
    return rows


def fit_top(fig: go.Figure, width: int = FIGURE_WIDTH, pad: int = 16) -> go.Figure:
    """``fig`` with its subplot titles wrapped to their room (:func:`fit_subplot_titles`) and its top margin grown
    to hold them (a figure with no title of its own)."""
    fit_subplot_titles(fig, width)
    fig.update_layout(margin=dict(t=subplot_title_px(fig) + pad))
    return fig


def subplot_title_px(fig: go.Figure) -> int:
    """The height (px) the tallest subplot title of ``fig`` takes above its subplot."""
    anns = _subplot_titles(_as_dict(fig)["layout"])
    lines = max((len(_lines(a.get("text", ""))) for a in anns), default=0)
    return int(lines * _LINE * _SUBPLOT_FONT + 4) if lines else 0


def legend_rows(names: Iterable[str], width: int = FIGURE_WIDTH, margin: int = 20) -> int:
    """How many rows a horizontal legend of ``names`` takes across ``width`` px (less ``margin``)."""
    room, rows, used = width - margin, 1, 0.0
    for name in names:
        w = text_px(name, _FONT) + _LEGEND_SYMBOL
        if used and used + w > room:
            rows, used = rows + 1, 0.0
        used += w
    return rows


def _legend_names(fig: go.Figure) -> List[str]:
    seen, names = set(), []
    for t in fig.data:
        if t.showlegend is False or not t.name:
            continue
        key = t.legendgroup or t.name
        if key not in seen:
            seen.add(key)
            names.append(t.name)
    return names


def _side_margins(fig: go.Figure) -> int:
    m = fig.layout.margin
    return int((_DEFAULT_MARGIN["l"] if m.l is None else m.l) + (_DEFAULT_MARGIN["r"] if m.r is None else m.r))


def legend_px(fig: go.Figure, width: int = FIGURE_WIDTH) -> int:
    """The height (px) ``fig``'s legend takes as one horizontal block (:func:`legend_above`, :func:`legend_below`):
    what a figure adds to its height to keep its plot area as tall with a long legend."""
    return legend_rows(_legend_names(fig), width, _side_margins(fig)) * _LEGEND_ROW


def legend_above(fig: go.Figure, height: int, title_lines: int = 0, width: int = FIGURE_WIDTH) -> int:
    """Put ``fig``'s legend in one horizontal block between its title (``title_lines`` lines) and the plot area
    (above the subplot titles), and grow the top margin to hold title, legend and subplot titles. Returns the top
    margin (px)."""
    rows = legend_rows(_legend_names(fig), width, _side_margins(fig))
    top = title_px(title_lines) + (_GAP if title_lines else _TITLE_PAD)
    fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", xref="paper", y=1 - top / height,
                                  yanchor="top", yref="container"))
    t = top + rows * _LEGEND_ROW + _GAP + subplot_title_px(fig) + _GAP
    fig.update_layout(height=height, margin=dict(t=t))
    return t


def legend_below(fig: go.Figure, height: int, width: int = FIGURE_WIDTH, axis_band: int = 50) -> int:
    """Put ``fig``'s legend in one horizontal block at the figure's bottom, under the x axes' tick labels and titles
    (``axis_band`` px under the plot area), and grow the bottom margin to hold both. Returns the bottom margin."""
    rows = legend_rows(_legend_names(fig), width, _side_margins(fig))
    b = axis_band + _GAP + rows * _LEGEND_ROW + _GAP
    fig.update_layout(height=height, margin=dict(b=b),
                      legend=dict(orientation="h", x=0, xanchor="left", xref="paper", y=_GAP / height,
                                  yanchor="bottom", yref="container"))
    return b


def menu_width(labels: Sequence[str], direction: str = "down") -> float:
    """The estimated width (px) of an updatemenu of buttons with ``labels``."""
    widths = [text_px(label, _FONT) + _BUTTON_PAD for label in labels]
    return max(widths, default=0) if direction in ("down", "up") else sum(widths)


def menu_beside(fig: go.Figure, gap: int = 10) -> int:
    """Stack ``fig``'s button menu (its first updatemenu) in one column in the right margin, level with the top of
    the plot area, and grow the right margin to hold it: beside the plot, it covers no title, legend or bar.
    Returns the right margin (px)."""
    menu = fig.layout.updatemenus[0]
    labels = [b.label for b in menu.buttons]
    r = int(gap + menu_width(labels) + gap)
    menu.update(direction="down", x=1, xanchor="left", y=1, yanchor="top", pad=dict(l=gap, r=0, t=0, b=0))
    fig.update_layout(margin=dict(r=r))
    return r


def headed(fig: go.Figure, height: int, main: str, message: Optional[str] = None, legend: Optional[str] = "above",
           width: int = FIGURE_WIDTH) -> int:
    """Lay out ``fig`` to read cleanly at ``width``: the title ``main`` at its top left with ``message`` wrapped under
    it in small type (:func:`wrapped_title`), its subplot titles wrapped to their room, its button menu (if any) in a
    column beside the plot (:func:`menu_beside`), its legend ``"above"`` the plot, under the title
    (:func:`legend_above`), ``"below"`` it, under the x axes' tick labels and titles (:func:`legend_below`: for
    axes whose tick labels do not turn), or where it is (``None``), and its top margin grown to hold it all.
    Returns the top margin (px)."""
    text, lines = wrapped_title(main, message, width)
    fig.update_layout(height=height, title=title_layout(text, lines, height))
    fit_subplot_titles(fig, width)
    if fig.layout.updatemenus:
        menu_beside(fig)
    if legend == "above":
        return legend_above(fig, height, title_lines=lines, width=width)
    if legend == "below":
        legend_below(fig, height, width)
    t = title_px(lines) + _GAP + subplot_title_px(fig) + _GAP
    fig.update_layout(margin=dict(t=t))
    return t


# --------------------------------------------------------------------------------------------------------- checks

def _as_dict(fig) -> dict:
    if isinstance(fig, dict):
        return fig
    return json.loads(fig.to_json())


def clipped_titles(fig, width: int = FIGURE_WIDTH) -> List[Tuple[str, str]]:
    """``(where, line)`` of each title line that does not fit at ``width`` px: a line of the figure's title past the
    figure's right edge, a subplot title wider than its room (:func:`fit_subplot_titles`), an axis title longer than
    its axis."""
    d = _as_dict(fig)
    layout = d.get("layout", {})
    m = _margin(layout)
    bad = []
    title = layout.get("title") or {}
    text = title.get("text", "") if isinstance(title, dict) else str(title)
    x = title.get("x", 0.05) if isinstance(title, dict) else 0.05
    start = x * width if (title.get("xref", "container") if isinstance(title, dict) else "container") == "container" \
        else m["l"] + x * (width - m["l"] - m["r"])
    for line, scale in _lines(text):
        if start + text_px(line, _TITLE_FONT * scale) > width:
            bad.append(("title", line))
    anns, centres = _title_centres(d, width)
    rows = _rows(anns)
    for i, a in enumerate(anns):
        same = [centres[j] for j in rows[round(float(a.get("y", 1)), 3)]]
        room = _room(same, same.index(centres[i]), centres[i], width)
        font = (a.get("font") or {}).get("size") or _SUBPLOT_FONT
        bad += [("subplot title", line) for line, s in _lines(a.get("text", "")) if text_px(line, font * s) > room]
    height = layout.get("height") or 450
    for name, axis, length in _axes(d, width, height):
        t = _axis_title(axis)
        if t and length and text_px(t, _AXIS_FONT) > length:
            bad.append((name + " title", t))
    return bad


def _axes(d: dict, width: float, height: float):
    """``(name, axis, length px)`` of every 2-D axis in the layout, and of every 3-D scene axis (length None)."""
    layout = d.get("layout", {})
    m = _margin(layout)
    pw, ph = width - m["l"] - m["r"], height - m["t"] - m["b"]
    for name, axis in layout.items():
        if re.fullmatch(r"[xy]axis\d*", name) and isinstance(axis, dict):
            lo, hi = axis.get("domain", [0, 1])
            yield name, axis, (hi - lo) * (pw if name[0] == "x" else ph)
        elif re.fullmatch(r"scene\d*", name) and isinstance(axis, dict):
            for a in ("xaxis", "yaxis", "zaxis"):
                yield f"{name}.{a}", axis.get(a) or {}, None


def _axis_title(axis: dict) -> str:
    t = axis.get("title")
    t = t.get("text", "") if isinstance(t, dict) else (t or "")
    return " ".join(line for line, _ in _lines(t)).strip()


def _axis_traces(d: dict, name: str) -> List[dict]:
    """The traces drawn on the 2-D axis ``name`` (``xaxis2`` -> traces with ``xaxis == "x2"``)."""
    ref = name[0] + name[5:]
    return [t for t in d.get("data", []) if (t.get(name[0] + "axis") or name[0]) == ref
            and t.get("type", "scatter") not in ("scatter3d", "table", "pie")]


def _categories(d: dict, name: str) -> List[str]:
    cats: List[str] = []
    for t in _axis_traces(d, name):
        for v in t.get(name[0]) or []:
            if isinstance(v, str) and v not in cats:
                cats.append(v)
    return cats


def _uses_axis(d: dict, name: str) -> bool:
    if "." in name:
        scene = name.split(".")[0]
        return any(t.get("type") == "scatter3d" and (t.get("scene") or "scene") == scene for t in d.get("data", []))
    return bool(_axis_traces(d, name))


#: An axis title's unit: the words in brackets at its end, ``(ms)``, ``(FoV radii, 1 = 8°)``.
UNIT = re.compile(r"\([^()]*[^\s()][^()]*\)\s*$")


def axes_without_units(fig) -> List[Tuple[str, str]]:
    """``(axis, title)`` of each axis a reader sees (it has traces, it is visible and shows its tick labels) whose
    title is missing, or, for an axis of numbers, carries no unit in brackets at its end (:data:`UNIT`). An axis of
    categories (run labels, layer names) needs words only."""
    d = _as_dict(fig)
    bad = []
    for name, axis, _ in _axes(d, FIGURE_WIDTH, 450):
        if axis.get("visible") is False or axis.get("showticklabels") is False or not _uses_axis(d, name):
            continue
        title = _axis_title(axis)
        categorical = "." not in name and bool(_categories(d, name))
        if not title or (not categorical and not UNIT.search(title)):
            bad.append((name, title))
    return bad


def _rotated(d: dict, name: str, width: float) -> bool:
    """Whether plotly turns the tick labels of x axis ``name`` (categories) to fit them: the widest is wider than
    the room one category has."""
    cats = _categories(d, name)
    if not cats:
        return False
    layout = d.get("layout", {})
    m = _margin(layout)
    lo, hi = (layout.get(name) or {}).get("domain", [0, 1])
    room = (hi - lo) * (width - m["l"] - m["r"]) / len(cats)
    angle = (layout.get(name) or {}).get("tickangle")
    return (angle not in (None, "auto", 0)) or max(text_px(c, _FONT) for c in cats) > room


def legend_over_ticks(fig, width: int = FIGURE_WIDTH) -> List[str]:
    """Why ``fig``'s horizontal legend may cover tick labels or an axis title, ``[]`` where it cannot: a legend in
    paper coordinates under the plot area (``y < 0``, plotly's default for a horizontal legend) covers rotated
    category labels at any depth, and sits on the tick labels and title of an x axis above that depth."""
    d = _as_dict(fig)
    layout = d.get("layout", {})
    legend = layout.get("legend") or {}
    if legend.get("orientation") != "h" or layout.get("showlegend") is False:
        return []
    if legend.get("yref", "paper") != "paper":
        return []
    y = legend.get("y", -0.1)
    if y >= 0:
        return []
    bottom = [n for n in layout if re.fullmatch(r"xaxis\d*", n) and _uses_axis(d, n)
              and (layout[n].get("showticklabels") is not False)]
    why = []
    height = layout.get("height") or 450
    m = _margin(layout)
    depth = -y * (height - m["t"] - m["b"])
    for n in bottom:
        if _rotated(d, n, width):
            why.append(f"{n}: the legend (y = {y}) is under rotated tick labels")
        elif depth < _TICK_BAND + (_LINE * _AXIS_FONT if _axis_title(layout[n]) else 0):
            why.append(f"{n}: the legend (y = {y}, {depth:.0f} px under the plot) is on the tick labels or title")
    return why


def _boxes(d: dict, width: float) -> List[Tuple[str, Tuple[float, float, float, float]]]:
    """``(what, (left, top, right, bottom))`` in px from the figure's top left: the title, the subplot titles, a
    legend and the button menus, as estimated from the layout (a legend or title in paper coordinates, or one
    without its position, is left out)."""
    layout = d.get("layout", {})
    m = _margin(layout)
    height = float(layout.get("height") or 450)
    pw, ph = width - m["l"] - m["r"], height - m["t"] - m["b"]
    out = [("plot area", (m["l"], m["t"], m["l"] + pw, m["t"] + ph))]
    title = layout.get("title") or {}
    if isinstance(title, dict) and title.get("text") and title.get("yref") == "container" and "y" in title:
        lines = _lines(title["text"])
        top = (1 - title["y"]) * height
        left = title.get("x", 0.05) * width
        w = max(text_px(line, _TITLE_FONT * s) for line, s in lines)
        out.append(("title", (left, top, left + w, top + len(lines) * _LINE * _TITLE_FONT)))
    anns, centres = _title_centres(d, width)
    for a, c in zip(anns, centres):
        lines = _lines(a.get("text", ""))
        w = max(text_px(line, _SUBPLOT_FONT * s) for line, s in lines)
        bottom = m["t"] + (1 - float(a.get("y", 1))) * ph
        out.append((f"subplot title {a.get('text', '')[:30]!r}",
                    (c - w / 2, bottom - len(lines) * _LINE * _SUBPLOT_FONT, c + w / 2, bottom)))
    legend = layout.get("legend") or {}
    if legend.get("orientation") == "h" and legend.get("yref") == "container" and "y" in legend:
        names = [t.get("name") for t in d.get("data", []) if t.get("name") and t.get("showlegend") is not False]
        rows = legend_rows(dict.fromkeys(names), int(width), int(m["l"] + m["r"]))
        top = (1 - legend["y"]) * height
        h = rows * _LEGEND_ROW
        top = top - h if legend.get("yanchor") == "bottom" else top
        out.append(("legend", (m["l"], top, width - m["r"], top + h)))
    for i, menu in enumerate(layout.get("updatemenus", []) or []):
        labels = [b.get("label", "") for b in menu.get("buttons", [])]
        direction = menu.get("direction", "down")
        w = menu_width(labels, direction)
        h = _BUTTON_H * (len(labels) if direction in ("down", "up") else 1)
        pad = menu.get("pad") or {}
        x = m["l"] + float(menu.get("x", -0.05)) * pw + pad.get("l", 0)
        xa, ya = menu.get("xanchor", "right"), menu.get("yanchor", "top")
        left = x - w if xa == "right" else x - w / 2 if xa == "center" else x
        # paper coordinates follow the plot area, which tick labels and a legend under it shrink (automargin):
        # the menu is wherever it lands for the plot area the layout gives and for one a third shorter
        tops = []
        for height_px in (ph, ph * 2 / 3):
            y = m["t"] + (1 - float(menu.get("y", 1))) * height_px + pad.get("t", 0)
            tops.append(y - h if ya == "bottom" else y - h / 2 if ya == "middle" else y)
        out.append((f"buttons {i}", (left, min(tops), left + w, max(tops) + h)))
    return out


def overlapping_boxes(fig, width: int = FIGURE_WIDTH) -> List[Tuple[str, str]]:
    """``(a, b)`` for each button menu or legend placed in pixels (:func:`_boxes`) that overlaps another part
    (``b``) or leaves the figure (``b = "figure edge"``); and for each pair of subplot titles that overlap."""
    d = _as_dict(fig)
    height = float(d.get("layout", {}).get("height") or 450)
    boxes = _boxes(d, width)
    bad = []
    for i, (a, (l1, t1, r1, b1)) in enumerate(boxes):
        placed = a in ("legend", "title") or a.startswith("buttons")
        if placed and (l1 < 0 or t1 < 0 or r1 > width or b1 > height):
            bad.append((a, "figure edge"))
        for b, (l2, t2, r2, b2) in boxes[i + 1:]:
            if not (placed or b in ("legend", "title") or b.startswith("buttons")
                    or (a.startswith("subplot title") and b.startswith("subplot title"))):
                continue
            if l1 < r2 and l2 < r1 and t1 < b2 and t2 < b1:
                bad.append((a, b))
    return bad

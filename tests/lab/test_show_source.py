"""The source listings of the lab (fovi_lab.lab.show_source / missing_marks) list a function, or with ``inner`` the one
function of that name defined inside a function or a module (the kernel a factory decorates, a loop body it builds),
and check a listing's marks against that function alone."""

import sys

import pytest

from fovi_lab import lab as kl


def _factory(n):
    scale = 2

    def body(x):
        y = x * scale  # the body's own line
        return y + n

    def other(x):
        return x - n

    return body, other


def _twice(flag):
    if flag:
        def k(x):
            return x
    else:
        def k(x):
            return -x
    return k


def test_inner_lists_only_the_named_function():
    marks = {"y = x * scale": "scale", "return x - n": "other", "scale = 2": "outer"}
    text = kl.show_source(_factory, marks, inner="body")
    lines = text.splitlines()
    assert lines[0].strip() == f"# {__name__}: _factory > body"
    assert lines[1].startswith("  1  def body(x):")           # numbered from the inner def, dedented
    assert lines[2].rstrip().endswith("# <- [scale]")
    assert [line.split()[0] for line in lines[1:-1]] == ["1", "2", "3"]   # body's three lines, not its sibling's
    # marks outside the inner function are missing there, though they are in the factory's source
    assert kl.missing_marks(_factory, marks, inner="body") == ["return x - n", "scale = 2"]
    assert kl.missing_marks(_factory, marks) == []
    assert "no longer here: ['return x - n', 'scale = 2']" in lines[-1]


def test_inner_is_found_in_a_module_at_any_depth():
    text = kl.show_source(sys.modules[__name__], {"return x - n": "minus"}, inner="other")
    assert text.splitlines()[0].strip() == f"# {__name__}: _factory > other"
    assert "# <- [minus]" in text
    assert kl.missing_marks(sys.modules[__name__], {"return x - n": "minus"}, inner="other") == []


def test_inner_must_name_exactly_one_function():
    with pytest.raises(ValueError, match="2 functions named 'k'"):
        kl.show_source(_twice, {}, inner="k")
    with pytest.raises(ValueError, match="0 functions named 'nope'"):
        kl.missing_marks(_factory, ["x"], inner="nope")


def test_without_inner_the_listing_is_the_whole_function():
    text = kl.show_source(_factory, {"return x - n": "other"})
    assert text.splitlines()[0].startswith("  1  def _factory(n):")
    assert "# <- [other]" in text and "no longer here" not in text

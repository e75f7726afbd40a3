"""The ``FOVI_*`` environment variables (:mod:`fovi_lab.settings`): the table lists exactly the names the package
reads, each kind is validated with the variable named, values are read on each access, the kernel-affecting ones
(and only they) change the replay signature's snapshot and the tune cache's setup key, and docs/settings.md is what
the table renders."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

import fovi_lab
import fovi_lab.settings as settings

PKG = Path(fovi_lab.__file__).resolve().parent
DOCS = PKG.parent / "docs" / "settings.md"
NAMES = [s.name for s in settings.SETTINGS]


def _source_names():
    """``FOVI_*`` names in the package's source, outside the settings module itself."""
    return {m for p in PKG.rglob("*.py") if p.name != "settings.py" or p.parent != PKG
            for m in re.findall(r"FOVI_[A-Z0-9_]*[A-Z0-9]", p.read_text())}


def test_the_table_lists_every_name_the_package_reads_and_no_other():
    assert len(set(NAMES)) == len(NAMES), "a name is in the table twice"
    read = _source_names()
    assert read == set(NAMES), (f"in the source, not in the table: {sorted(read - set(NAMES))}; "
                                f"in the table, not in the source: {sorted(set(NAMES) - read)}")


# a read of a FOVI_* variable past the table: os.environ.get / os.getenv / os.environ[...] (an assignment is a write)
_DIRECT_READ = re.compile(r"""(?:environ\.get|getenv)\(\s*["']FOVI_"""
                          r"""|environ\[\s*["']FOVI_[A-Z0-9_]+["']\s*\](?!\s*=[^=])""")


def test_the_package_reads_the_variables_only_through_the_table():
    direct = [f"{p.relative_to(PKG)}:{n}" for p in PKG.rglob("*.py") if p.name != "settings.py"
              for n, line in enumerate(p.read_text().splitlines(), 1) if _DIRECT_READ.search(line)]
    assert direct == []
    assert _DIRECT_READ.search('os.environ.get("FOVI_X")') and _DIRECT_READ.search('os.environ["FOVI_X"]')
    assert not _DIRECT_READ.search('os.environ["FOVI_X"] = "1"')


def test_every_entry_is_complete():
    for s in settings.SETTINGS:
        assert s.kind in settings.KINDS and s.what.endswith(".") and s.who, s.name
        assert s.parse(None) == s.default, s.name
        if s.default is None:
            assert s.unset, f"{s.name}: a default of None needs its rule in words"
        for c in s.choices:
            assert s.parse(c) == c, s.name
    assert set(settings.KERNEL_AFFECTING) == {s.name for s in settings.SETTINGS if s.kernel}
    assert {"FOVI_COMMIT", "FOVI_BENCH_VERBOSE", "FOVI_KNN_REPLAY", "FOVI_TUNE_CACHE"}.isdisjoint(
        settings.KERNEL_AFFECTING)


def test_the_tune_keys_name_their_first_switches_in_a_fixed_order():
    # the setup keys of existing tune caches list these switches (those set) in this order: a new kernel-affecting
    # entry goes after them, so such keys stay readable
    assert settings.KERNEL_AFFECTING[:6] == (
        "FOVI_WARP_MATHDX", "FOVI_WARP_MMA", "FOVI_KNN_GRAD_PATH", "FOVI_KNN_DX_PATH", "FOVI_KNN_DW_PATH",
        "FOVI_KNN_FWD_PATH")


GOOD = [
    ("FOVI_WARP_MMA", "off", "off"), ("FOVI_WARP_MMA", "", "auto"),
    ("FOVI_KNN_REPLAY", "ON", "on"), ("FOVI_KNN_REPLAY", "Off", "off"),
    ("FOVI_KNN_TAP_TABLE_MIB", "0", 0), ("FOVI_KNN_TAP_TABLE_MIB", "1024", 1024),
    ("FOVI_WARP_I2C_MIB", "0.02", 0.02), ("FOVI_WARP_I2C_MIB", "", 32.0), ("FOVI_KNN_STAGE_MIB", "0", 0.0),
    ("FOVI_KNN_STAGE_MIB", "1e-4", 1e-4),
    ("FOVI_WARP_MATHDX", "0", False), ("FOVI_WARP_MATHDX", " Off ", False), ("FOVI_WARP_MATHDX", "TRUE", True),
    ("FOVI_WARP_MATHDX", "", None), ("FOVI_WARP_MATHDX", "  ", None), ("FOVI_BENCH_VERBOSE", "yes", True),
    ("FOVI_TUNE_CACHE", "/tmp/t.json", Path("/tmp/t.json")), ("FOVI_TUNE_CACHE", "", None),
    ("FOVI_COMMIT", "abc123", "abc123"),
]


@pytest.mark.parametrize("name, value, want", GOOD)
def test_good_values_parse(monkeypatch, name, value, want):
    monkeypatch.setenv(name, value)
    got = settings.get(name)
    assert got == want and type(got) is type(want), (name, value, got)


BAD = [
    ("FOVI_WARP_MMA", "always", "'auto' or 'off'"),                       # choice
    ("FOVI_WARP_MMA", "OFF", "'auto' or 'off'"),                          # choices compared as written
    ("FOVI_KNN_REPLAY", "sometimes", "'auto', 'on', 'off' or 'in-place' (any case)"),
    ("FOVI_KNN_GRAD_PATH", "bogus", "'fused', 'staged' or 'auto'"),
    ("FOVI_KNN_TAP_TABLE_MIB", "-1", "a whole number of MiB >= 0"),      # count
    ("FOVI_KNN_TAP_TABLE_MIB", "2.5", "a whole number of MiB >= 0"),
    ("FOVI_KNN_TAP_TABLE_MIB", "", "a whole number of MiB >= 0"),        # empty is an error here
    ("FOVI_WARP_I2C_MIB", "0", "a number of MiB > 0"),                   # number
    ("FOVI_WARP_I2C_MIB", "nan", "a number of MiB > 0"),
    ("FOVI_WARP_I2C_MIB", "inf", "a number of MiB > 0"),
    ("FOVI_KNN_STAGE_MIB", "-1", "a number of MiB >= 0"),
    ("FOVI_KNN_STAGE_MIB", "", "a number of MiB >= 0"),
    ("FOVI_KNN_FUSED_PARTIAL_MIB", "lots", "a number of MiB >= 0"),
    ("FOVI_WARP_MATHDX", "maybe", "'1', 'true', 'yes', 'on', '0', 'false', 'no' or 'off' (any case)"),   # flag
    ("FOVI_BENCH_VERBOSE", "2", "'1', 'true'"),
]


@pytest.mark.parametrize("name, value, expected", BAD)
def test_a_bad_value_raises_naming_the_variable_the_value_and_what_was_expected(monkeypatch, name, value, expected):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as err:
        settings.get(name)
    msg = str(err.value)
    assert msg.startswith(f"{name}: expected {expected}") and msg.endswith(f"got {value!r}"), msg


def test_every_kind_is_covered_by_the_checks_above():
    kinds = {settings._TABLE[n].kind for n, _, _ in BAD} | {settings._TABLE[n].kind for n, _, _ in GOOD}
    assert kinds == set(settings.KINDS)


def test_an_unknown_name_is_a_key_error():
    with pytest.raises(KeyError, match="FOVI_NO_SUCH"):
        settings.get("FOVI_NO_SUCH")
    with pytest.raises(KeyError, match="FOVI_NO_SUCH"):
        settings.snapshot(("FOVI_NO_SUCH",))
    with pytest.raises(KeyError, match="FOVI_NO_SUCH"):
        with settings.override(FOVI_NO_SUCH="1"):
            pass


def test_values_are_read_on_each_access(monkeypatch):
    from fovi_lab.kernels.forward import plans
    from fovi_lab.ops.reference import stage_budget_bytes
    monkeypatch.delenv("FOVI_KNN_STAGE_MIB", raising=False)
    monkeypatch.delenv("FOVI_WARP_I2C_MIB", raising=False)
    assert stage_budget_bytes() == 512 << 20 and plans._i2c_stage_bytes() == 32 << 20
    monkeypatch.setenv("FOVI_KNN_STAGE_MIB", "1")            # set after every import
    monkeypatch.setenv("FOVI_WARP_I2C_MIB", "0.5")
    assert stage_budget_bytes() == 1 << 20 and plans._i2c_stage_bytes() == 1 << 19
    monkeypatch.setenv("FOVI_WARP_I2C_MIB", "-3")
    with pytest.raises(ValueError, match="FOVI_WARP_I2C_MIB"):
        plans._i2c_stage_bytes()
    assert plans.mmas_split(64, 144) == (29, 5)              # the splits' targets are constants: 2048 warps


def test_the_defaults_are_what_the_code_does_unset(monkeypatch):
    from fovi_lab.graph.meta import derived_table_limit
    from fovi_lab.kernels.adjoint.configs import grad_stage_budget_bytes, stage_fp32_default
    from fovi_lab.kernels.adjoint.fused import _budget_bytes
    from fovi_lab.kernels.forward import plans
    from fovi_lab.ops import replay, tune_cache
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/tmp/xdg")
    assert derived_table_limit() == 512 << 20 and grad_stage_budget_bytes() == 64 << 20
    assert _budget_bytes() == 64 << 20 and plans._i2c_stage_bytes() == 32 << 20
    assert plans._i2c_gather_kind() == "warp" and stage_fp32_default() is False
    assert plans.simts_split(1024, 576)[0] == 32 and plans.simts_split(1024, 576, (4, 8))[0] == 72
    assert plans.store_mode(None, 4 << 20) == "direct" and plans.store_mode(None, (4 << 20) + 1) == "staged"
    assert replay.replay_mode() == "auto"
    assert tune_cache.cache_path() == Path("/tmp/xdg/fovi_lab/tune.json")


def test_the_two_readers_of_mathdx_agree(monkeypatch):
    from fovi_lab.kernels.adjoint.staged import _mathdx_env
    from fovi_lab.kernels.forward.configs import mathdx_default
    for value, want in (("1", True), ("0", False), ("off", False), ("False", False), ("no", False), ("on", True)):
        monkeypatch.setenv("FOVI_WARP_MATHDX", value)
        assert mathdx_default() is want and _mathdx_env() is want, value
    monkeypatch.delenv("FOVI_WARP_MATHDX")
    assert mathdx_default() is None and _mathdx_env() is None


def _other_value(s):
    """A valid value of ``s`` other than its default."""
    return {"choice": next((c for c in s.choices if c != s.default), None), "count": "7", "number": "3.5",
            "flag": "0" if s.default else "1", "path": "/tmp/elsewhere.json", "text": "something"}[s.kind]


@pytest.mark.parametrize("name", NAMES)
def test_snapshot_follows_exactly_the_kernel_affecting_variables(monkeypatch, name):
    s = settings._TABLE[name]
    monkeypatch.delenv(name, raising=False)
    base = settings.snapshot()
    monkeypatch.setenv(name, _other_value(s))
    assert (settings.snapshot() != base) is s.kernel, name
    monkeypatch.delenv(name)
    assert settings.snapshot() == base


def test_snapshot_of_some_names(monkeypatch):
    names = ("FOVI_WARP_MMA", "FOVI_COMMIT")
    monkeypatch.delenv("FOVI_WARP_MMA", raising=False)
    monkeypatch.setenv("FOVI_COMMIT", "x")
    base = settings.snapshot(names)
    assert len(base) == 2 and base[0] is None and base[1] is not None
    monkeypatch.setenv("FOVI_WARP_MMA", "off")
    assert settings.snapshot(names) != base
    monkeypatch.setenv("NOT_FOVI_AT_ALL", "1")
    assert settings.snapshot(names) == settings.snapshot(names)


@pytest.mark.parametrize("name", settings.KERNEL_AFFECTING)
def test_the_tune_cache_key_changes_with_every_kernel_affecting_variable(monkeypatch, name):
    from fovi_lab.ops import tune_cache
    for n in NAMES:
        monkeypatch.delenv(n, raising=False)
    base = tune_cache.setup_key(torch.device("cpu"))
    assert "FOVI_" not in base
    value = _other_value(settings._TABLE[name])
    monkeypatch.setenv(name, value)
    key = tune_cache.setup_key(torch.device("cpu"))
    assert key == f"{base}/{name}={value}"
    monkeypatch.setenv("FOVI_COMMIT", "elsewhere")                 # changes no kernel: the same key
    assert tune_cache.setup_key(torch.device("cpu")) == key


def test_the_tune_cache_key_lists_the_switches_in_table_order(monkeypatch):
    from fovi_lab.ops import tune_cache
    for n in NAMES:
        monkeypatch.delenv(n, raising=False)
    base = tune_cache.setup_key("cpu")
    monkeypatch.setenv("FOVI_KNN_FWD_PATH", "binned")
    monkeypatch.setenv("FOVI_WARP_MMA", "off")
    monkeypatch.setenv("FOVI_KNN_STAGE_MIB", "64")
    assert tune_cache.setup_key("cpu") == f"{base}/FOVI_WARP_MMA=off,FOVI_KNN_FWD_PATH=binned,FOVI_KNN_STAGE_MIB=64"


def test_override_sets_validates_and_restores(monkeypatch):
    monkeypatch.setenv("FOVI_KNN_REPLAY", "on")
    monkeypatch.delenv("FOVI_KNN_GRAD_PATH", raising=False)
    with settings.override(FOVI_KNN_REPLAY="off", FOVI_KNN_GRAD_PATH="fused"):
        assert settings.get("FOVI_KNN_REPLAY") == "off" and settings.get("FOVI_KNN_GRAD_PATH") == "fused"
    assert os.environ["FOVI_KNN_REPLAY"] == "on" and "FOVI_KNN_GRAD_PATH" not in os.environ
    with settings.override(FOVI_KNN_REPLAY=None):
        assert "FOVI_KNN_REPLAY" not in os.environ
    assert os.environ["FOVI_KNN_REPLAY"] == "on"
    with pytest.raises(ValueError, match="FOVI_KNN_GRAD_PATH: expected"):
        with settings.override(FOVI_KNN_REPLAY="off", FOVI_KNN_GRAD_PATH="sideways"):
            pass
    assert os.environ["FOVI_KNN_REPLAY"] == "on", "a bad value sets nothing"
    with pytest.raises(RuntimeError):
        with settings.override(FOVI_KNN_REPLAY="off"):
            raise RuntimeError("inside")
    assert os.environ["FOVI_KNN_REPLAY"] == "on"


def test_raw_is_the_string_as_set(monkeypatch):
    monkeypatch.setenv("FOVI_KNN_DX_PATH", "nope")
    assert settings.raw("FOVI_KNN_DX_PATH") == "nope"
    monkeypatch.delenv("FOVI_KNN_DX_PATH")
    assert settings.raw("FOVI_KNN_DX_PATH") is None


def test_the_docs_table_is_what_the_table_renders():
    assert DOCS.read_text() == settings.render_markdown(), (
        "docs/settings.md differs from the table: run python -c 'import fovi_lab.settings as s; s.write_docs()'")
    text = DOCS.read_text()
    assert all(f"`{n}`" in text for n in NAMES)
    assert "(settings.md)" in (DOCS.parent / "operator.md").read_text()


def test_write_docs_writes_the_rendering(tmp_path):
    out = settings.write_docs(tmp_path / "s.md")
    assert out.read_text() == settings.render_markdown()


def test_the_settings_module_imports_nothing_of_the_package():
    import ast
    tree = ast.parse((PKG / "settings.py").read_text())
    mods = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    mods += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in mods if m.startswith("fovi_lab")]


def test_a_misspelt_setting_is_named_with_the_one_it_meant():
    """A variable under the package's prefixes that no setting has changes nothing: importing the package warns,
    naming the setting it most likely meant; the tools' variables (other prefixes) are not the package's."""
    import subprocess
    import sys

    env = {"FOVI_KNN_DX_PAHT": "taps", "FOVI_WARP_NOTHING_LIKE_IT": "1", "FOVI_GPU_SCRATCH": "/tmp",
           "FOVI_KNN_DX_PATH": "taps"}
    assert settings.unknown_set(env) == {"FOVI_KNN_DX_PAHT": "FOVI_KNN_DX_PATH", "FOVI_WARP_NOTHING_LIKE_IT": None}
    with pytest.warns(UserWarning) as caught:
        settings.warn_unknown(env)
    assert [str(w.message).split(":")[0] for w in caught] == [
        "FOVI_KNN_DX_PAHT is set, but no fovi_lab setting has that name (did you mean FOVI_KNN_DX_PATH?)",
        "FOVI_WARP_NOTHING_LIKE_IT is set, but no fovi_lab setting has that name"]
    done = subprocess.run([sys.executable, "-c", "import fovi_lab"], capture_output=True, text=True,
                          env=dict(os.environ, FOVI_WARP_MMMA="off"))
    assert done.returncode == 0
    assert "FOVI_WARP_MMMA is set, but no fovi_lab setting has that name (did you mean FOVI_WARP_MMA?)" in done.stderr
    clean = {k: v for k, v in os.environ.items() if not k.startswith(settings.OWN_PREFIXES)}
    quiet = subprocess.run([sys.executable, "-W", "error", "-c", "import fovi_lab"], capture_output=True, text=True,
                           env=clean)
    assert quiet.returncode == 0 and "no fovi_lab setting" not in quiet.stderr, quiet.stderr

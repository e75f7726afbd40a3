"""environment.yml and pyproject.toml name the same dependencies; the README's commands are what CI runs."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject_names():
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {_name(r) for r in proj["dependencies"]}
    for extra in proj["optional-dependencies"].values():
        names |= {_name(r) for r in extra}
    return names


def _environment_names():
    names = set()
    text = (ROOT / "environment.yml").read_text()
    for line in text.split("dependencies:", 1)[1].splitlines():
        m = re.match(r"^\s*-\s+(.+?)\s*$", line)
        if not m or m.group(1).endswith(":"):
            continue
        item = m.group(1)
        if item.startswith("-e ") or item.startswith("python=") or item == "pip":
            continue
        names.add(_name(item))
    return names


def test_environment_yml_agrees_with_pyproject():
    assert _environment_names() == _pyproject_names()


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for cmd in ('python -m pip install torch==2.13.0 -e ".[lab,test]"', "python -m pytest --nbval"):
        assert cmd in readme and cmd in ci, cmd


def _wheel(tmp_path):
    import importlib.util
    import subprocess
    import sys
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path)]
                   + isolation, check=True, capture_output=True)
    (wheel,) = tmp_path.glob("fovi_lab-*.whl")
    return wheel


def test_the_wheel_carries_the_tables_and_records(tmp_path):
    """The config, layer and figure tables and the benchmark records are package data: a wheel built from this tree
    holds every one of them, and an install of it (not editable, outside the checkout) finds the records: ``auto``'s
    table of the H200 and the figures' sweeps come from inside the installed package, and no folder beside it is read
    as a checkout's data."""
    import subprocess
    import sys
    import zipfile
    data = sorted(str(p.relative_to(ROOT)) for pat in ("*.toml", "records/*/*") for p in (ROOT / "fovi_lab").rglob(pat)
                  if p.is_file())
    assert "fovi_lab/kernels/forward/configs.toml" in data and "fovi_lab/records/h200/forward.jsonl.gz" in data
    wheel = _wheel(tmp_path / "dist")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [t for t in data if t not in names] == []
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    probe = (
        "import fovi_lab, fovi_lab.ops.records as R, fovi_lab.ops.dispatch as D\n"
        f"assert fovi_lab.__file__.startswith({str(site)!r}), fovi_lab.__file__\n"
        "assert R.CHECKOUT_ROOT is None and all(p.is_relative_to(R.RECORDS_DIR) for p in R.record_files())\n"
        "t = D.recorded_table()\n"
        "h200 = [k for k in t if k[0] == 'NVIDIA H200']\n"
        "assert {k[1] for k in h200} == {'forward', 'train-step'}, len(h200)\n"
        "from fovi_lab.graph.layers import layer_meta\n"
        "m = layer_meta('res18_layer1')\n"
        "shape = (m.cin, m.cout, m.nin, m.nout, m.k, m.p64, m.v)\n"
        "assert any(k[2] == shape and k[3] == 64 for k in h200)\n"
        "print(len(h200))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin",
                                                                          "HOME": str(tmp_path)},
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) > 100

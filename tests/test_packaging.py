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


def test_the_wheel_carries_the_tables(tmp_path):
    """The config, layer and figure tables are package data (``*.toml`` beside their modules): a wheel built from
    this tree holds every one of them, so a non-editable install reads the same tables."""
    import subprocess
    import sys
    import zipfile
    tables = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fovi_lab").rglob("*.toml"))
    assert "fovi_lab/kernels/forward/configs.toml" in tables and "fovi_lab/graph/layers.toml" in tables
    import importlib.util
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path)]
                   + isolation, check=True, capture_output=True)
    (wheel,) = tmp_path.glob("fovi_lab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [t for t in tables if t not in names] == []

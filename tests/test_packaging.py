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

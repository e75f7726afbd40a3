"""tools/gpu/run.sh, checked here before a GPU machine runs it: a lent machine comes for minutes, so a job that breaks
on a renamed option or a missing file costs that call. Each job runs under stand-ins (``python3`` writes down its
arguments, ``timeout`` runs its command, ``nvidia-smi`` prints a line), and every command it would have run is then
parsed by the package's own parsers (``python -m fovi_lab ...`` and its modules), the test files and tools it names
checked to exist, and the ``layer:B`` targets of the profiling tool checked against the layer table."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "tools" / "gpu" / "run.sh"

#: The jobs checked (ncu needs Nsight Compute's own binary; notebooks run tools/gpu/run_notebooks.sh, its own check).
JOBS = ("forward", "sweep", "train-step", "backward", "network", "host", "parity", "all", "networks-fovi", "steps",
        "finish", "fovi-layers", "memory", "budgets", "networks-all", "in-place", "ddp")

#: ``python3 -m MODULE`` of the package -> the words of ``python -m fovi_lab`` that run the same command.
MODULES = {"fovi_lab": [], "fovi_lab.bench.forward": ["bench", "forward"],
           "fovi_lab.bench.network": ["bench", "network"], "fovi_lab.bench.host": ["bench", "host"],
           "fovi_lab.bench.ddp": ["bench", "ddp"]}


pytestmark = pytest.mark.skipif(shutil.which("bash") is None or not sys.platform.startswith("linux"),
                                reason="needs bash on Linux (run.sh reads /proc)")


def _stand_ins(folder: Path, log: Path) -> dict:
    """The environment run.sh runs in here: stand-ins first on PATH, $OUT a fresh folder, and what a job keeps for
    the next call in a folder of the test's (``FOVI_GPU_SCRATCH``), not in /tmp."""
    folder.mkdir(exist_ok=True)
    scripts = {
        "python3": f"#!{sys.executable}\nimport json, sys\n"
                   f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n",
        # a duration that is no whole number of seconds > 0 (a job's budget spent) fails the job's check
        "timeout": "#!/usr/bin/env bash\n[[ $1 =~ ^[0-9]+$ && $1 -gt 0 ]] || { echo \"timeout $1\" >&2; exit 125; }\n"
                   "shift\nexec \"$@\"\n",
        "nvidia-smi": "#!/usr/bin/env bash\necho 'a stand-in GPU, 0.0'\n",
    }
    for name, text in scripts.items():
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    out = folder / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOVI_")}
    env.update(PATH=f"{folder}{os.pathsep}{os.environ.get('PATH', '')}", OUT=str(out), FOVI_TIMEOUT="560",
               FOVI_GPU_SCRATCH=str(folder / "scratch"))        # what a job keeps for the next call
    return env


def _commands(job: str, tmp_path: Path) -> list:
    log = tmp_path / "calls.jsonl"
    env = _stand_ins(tmp_path / "bin", log)
    done = subprocess.run(["bash", str(RUN), job], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"run.sh {job}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert f"{job} done in" in done.stdout, done.stdout[-2000:]
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _check_command(argv: list) -> str:
    """Parse one ``python3`` command run.sh would run with the parser that would take it; returns what it was."""
    from fovi_lab.cli import build_parser
    from fovi_lab.graph.layers import resolve_layer

    if argv[:2] == ["-m", "pytest"]:
        files = [a for a in argv if a.startswith("tests/")]
        assert files, argv
        for f in files:
            assert (ROOT / f).is_file(), f"run.sh runs {f}, which does not exist"
        return "pytest"
    if argv and argv[0].startswith("tools/"):
        assert (ROOT / argv[0]).is_file(), f"run.sh runs {argv[0]}, which does not exist"
        if argv[0].endswith("profile_step.py"):
            for target in [a for a in argv[1:] if not a.startswith("-")]:
                layer, b = target.split(":")
                resolve_layer(layer)
                assert int(b) > 0, target
        return argv[0]
    assert argv[0] == "-m", argv
    module, rest = argv[1], argv[2:]
    if module == "fovi_lab.bench.backward":
        words = ["bench", rest[0], *rest[1:]] if rest and rest[0] in ("train-step", "backward") else \
            ["bench", "backward", *rest]
    else:
        assert module in MODULES, f"run.sh runs python3 -m {module}, which this check does not know"
        words = MODULES[module] + rest
    try:
        build_parser(words).parse_args(words)
    except SystemExit as exc:
        raise AssertionError(f"python -m fovi_lab {' '.join(words)}: the parser refuses it (exit {exc.code})")
    return " ".join(words[:2])


@pytest.mark.parametrize("with_fovi", (True, False), ids=("after networks-fovi", "alone"))
@pytest.mark.parametrize("job", JOBS)
def test_each_job_runs_commands_the_package_accepts(job, with_fovi, tmp_path, capsys):
    if with_fovi:       # steps reads fovi's network records where networks-fovi, the call before, left them
        fovi_records = tmp_path / "bin" / "scratch" / "fovi_lab_out" / "network_fovi.jsonl"
        fovi_records.parent.mkdir(parents=True)
        fovi_records.write_text("")
    calls = _commands(job, tmp_path)
    assert calls, f"run.sh {job} ran no python3 command"
    what = [_check_command(argv) for argv in calls]
    capsys.readouterr()                         # the parsers' own output, if any
    if job == "steps":                          # the stems' dx under the switch: warp_train alone
        assert "bench train-step" in what and any("--only" in argv for argv in calls)
        assert any("--alternatives" in argv for argv in calls) == with_fovi


def test_the_runner_refuses_an_unknown_job(tmp_path):
    env = _stand_ins(tmp_path / "bin", tmp_path / "calls.jsonl")
    done = subprocess.run(["bash", str(RUN), "no-such-job"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "unknown job no-such-job" in done.stderr


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "tools" / "gpu").glob("*.sh")))
def test_every_gpu_script_parses(script):
    done = subprocess.run(["bash", "-n", str(ROOT / "tools" / "gpu" / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

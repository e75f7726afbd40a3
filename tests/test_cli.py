"""The command line a new user meets: one parser tree, one-line usage errors, help at every level, and an installed
package that never writes into its own folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fovi_lab import cli

PKG = Path(cli.__file__).resolve().parent
LEAVES = [["demo"], ["tune"], ["train"], ["warmup"], ["report"]] + [["bench", b] for b in cli.BENCHMARKS]


def _usage_error(argv, capsys):
    """Run ``python -m fovi_lab argv`` in this process; the exit status and stderr of its usage error."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out, err = capsys.readouterr()
    assert out == "", out                       # no header lines before the error
    return exc.value.code, err


@pytest.mark.parametrize("argv, first_line", [
    (["train", "--steps", "-1"], "python -m fovi_lab train: error: --steps: expected an integer >= 1, got -1"),
    (["train", "--batch", "0"], "python -m fovi_lab train: error: --batch: expected an integer >= 1, got 0"),
    (["train", "--backend", "nope"], "python -m fovi_lab train: error: --backend: unknown 'nope'; registered "
                                     "backends that train: torch_binned, torch_compact"),
    (["train", "--backend", "warp_compact"], "--backend: 'warp_compact' is forward-only"),
    (["train", "--lr", "0"], "--lr: expected a number > 0, got 0"),
    (["train", "--out", "no/such/folder/r.json"], "--out: expected a file in an existing folder"),
    (["bench", "forward", "--layers", "nope"], "python -m fovi_lab bench forward: error: --layers: unknown layer "
                                               "'nope'; known: alex_L0"),
    (["bench", "forward", "--batches", "16", "0"], "--batches: expected an integer >= 1, got 0"),
    (["bench", "train-step", "--reps", "0"], "python -m fovi_lab bench train-step: error: --reps: expected an "
                                             "integer >= 1, got 0"),
    (["bench", "adjoints", "--rounds", "0"], "--rounds: expected an integer >= 1, got 0"),
    (["bench", "dtypes", "--device", "meta"], "--device: expected cpu or cuda[:i], got 'meta'"),
    (["bench", "compile", "--batch", "x"], "--batch: expected an integer >= 1, got 'x'"),
    (["demo", "--layer", "nope"], "python -m fovi_lab demo: error: --layer: unknown layer 'nope'"),
    (["demo", "--backends", "nope"], "--backends: unknown 'nope'; registered:"),
    (["tune", "--batches", "0"], "--batches: expected an integer >= 1, got 0"),
    (["warmup", "--jobs", "0"], "--jobs: expected an integer >= 1, got 0"),
    (["bench", "forward", "--configs", "m16n32", "nope"], "python -m fovi_lab bench forward: error: --configs: no "
                                                          "forward config is named 'nope' (python -m fovi_lab "
                                                          "configs lists them)"),
    (["bench", "forward", "--binned-configs", "zz"], "--binned-configs: no forward config is named 'zz'"),
    (["warmup", "--aot-arch", "12"], "python -m fovi_lab warmup: error: --aot-arch: expected an architecture Warp's "
                                     "NVRTC compiles for (75, 80"),
    (["warmup", "--only", "sd_b8o8u4", "nope"], "--only: no module of this warmup is named 'nope' (python -m "
                                                "fovi_lab configs lists"),
    (["report", "--data", "no/such/folder"], "--data: expected an existing folder, got 'no/such/folder'"),
    (["bench"], "python -m fovi_lab bench: error: expected a benchmark: forward, backward, train-step"),
    (["bench", "nope"], "BENCHMARK: invalid choice: 'nope'"),
    (["nope"], "COMMAND: invalid choice: 'nope'"),
    (["train", "--no-such-option"], "python -m fovi_lab train: error: unrecognized arguments: --no-such-option"),
    (["bench", "host", "--what", "x"], "python -m fovi_lab bench host: error: unrecognized arguments: --what x"),
    (["explain", "--device", "h300"], "--device: expected cpu, cuda[:i] or one of h200, h100, a100, got 'h300'"),
    (["bench", "forward", "--layers"], "--layers: expected at least one argument"),      # never "every layer"
    (["bench", "train-step", "--layers"], "--layers: expected at least one argument"),
    (["demo", "--backends"], "--backends: expected at least one argument"),
    (["demo", "--layer", "res18_layer4_0_rf2", "--rf", "rf1"], "python -m fovi_lab demo: error: --rf: rf1 "
                                                                  "contradicts --layer res18_layer4_0_rf2"),
    (["bench", "forward", "--out", "~no_such_user_here/r.jsonl"], "--out: expected a file in an existing folder"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_usage_error_is_one_line_naming_the_argument(argv, first_line, capsys):
    code, err = _usage_error(argv, capsys)
    assert code == 2
    assert err.endswith("(see --help)\n") and err.count("\n") == 1, err
    assert first_line in err and "Traceback" not in err and "usage:" not in err


def test_a_grid_too_small_for_fovis_network_is_refused_at_the_door(capsys):
    pytest.importorskip("fovi", reason="fovi is not installed")
    code, err = _usage_error(["bench", "network", "--net", "resnet18", "--in-res", "8"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("python -m fovi_lab bench network: error: --in-res: fovi's resnet18 cannot be built on a "
                          "8-pixel grid (fovi: "), err


def test_the_network_benchmark_without_fovi_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "fovi.arch.knn", None)       # makes `import fovi.arch.knn` fail
    code, err = _usage_error(["bench", "network", "--net", "resnet18", "--batches", "1"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("python -m fovi_lab bench network: error: fovi: fovi_lab.integrations.fovi needs fovi's "
                          "fovi.arch") and 'pip install "fovi-lab[fovi]"' in err, err


def test_the_train_step_without_fovi_says_its_backends_are_not_timed(monkeypatch, tmp_path, capsys):
    """Asked for by name (``--only fovi_cuda``), fovi's backends without fovi are a usage error; in a default run,
    a line says they are not timed and why, instead of leaving them out without a word."""
    pytest.importorskip("warp")
    monkeypatch.setitem(sys.modules, "fovi.arch.knn", None)       # makes `import fovi.arch.knn` fail
    out = str(tmp_path / "t.jsonl")
    base = ["bench", "train-step", "--layers", "res18_layer4_0", "--batches", "1", "--reps", "1", "--out", out]
    code, err = _usage_error(base + ["--only", "fovi_cuda"], capsys)
    assert code == 2 and err.startswith("python -m fovi_lab bench train-step: error: --only: fovi's backends need "
                                        "fovi: fovi_lab.integrations.fovi needs fovi's fovi.arch"), err
    assert cli.main(base + ["--only", "torch_compact", "warp_train"]) == 0
    assert "fovi's own backends are not timed" not in capsys.readouterr().out       # none asked for
    assert cli.main(base + ["--warmup", "0"]) == 0
    assert "# fovi's own backends are not timed: fovi_lab.integrations.fovi needs fovi's fovi.arch" in \
        capsys.readouterr().out


def test_every_module_main_parses_as_the_command_line(capsys):
    """``fovi_lab.train.main`` and the others build their parser from the same ``add_arguments``."""
    from fovi_lab import train
    from fovi_lab.bench import backward
    with pytest.raises(SystemExit) as exc:
        train.main(["--steps", "0"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("python -m fovi_lab train: error: --steps: expected an integer >= 1, got 0 "
                                       "(see --help)\n")
    with pytest.raises(SystemExit) as exc:                  # the module's own mode word still comes first
        backward.main(["train-step", "--batches", "0"])
    assert exc.value.code == 2 and "python -m fovi_lab bench train-step: error: --batches" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"]] + [leaf + ["--help"] for leaf in LEAVES],
                         ids=lambda a: " ".join(a[:-1]) or "top")
def test_help_exits_0_at_every_level_with_defaults_in_plain_text(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith(f"usage: python -m fovi_lab {' '.join(argv[:-1])}".rstrip())
    for markup in ("``", ":mod:", ":func:", ":class:", "{backward,train-step}"):
        assert markup not in out, markup
    description = out.split("\n\n")[1]
    assert description.rstrip().endswith((".", ":")), description          # a whole sentence, not cut short
    if argv[:-1] in LEAVES:
        assert "(default: " in out


def test_the_top_level_help_lists_each_command_on_one_line(capsys):
    assert cli.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in cli.COMMANDS:
        (line,) = [ln for ln in lines if ln.split()[:1] == [name]]
        assert cli.COMMANDS[name][1].split()[0] in line


def test_every_option_has_help():
    parser = cli.build_parser()
    todo, seen = [parser], 0
    while todo:
        p = todo.pop()
        for action in p._actions:
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):                  # a subparsers action: its parsers
                todo += list(choices.values())
            elif action.option_strings:
                seen += 1
                assert action.help and len(action.help) > 10, (p.prog, action.option_strings)
    assert seen > 80


def test_a_bench_record_lands_under_the_current_folder(tmp_path, monkeypatch, capsys):
    """Run from a checkout too, ``bench forward`` writes ``data/`` under the current folder, not beside the package,
    and says where."""
    pytest.importorskip("warp")
    before = {p: p.stat().st_mtime for p in PKG.rglob("*.jsonl*")}
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "forward", "--layers", "res18_layer4_0", "--batches", "1", "--reps", "1",
                     "--warmup", "0", "--no-cached"]) == 0
    (rec_file,) = (tmp_path / "data").glob("forward_*.jsonl")
    out = capsys.readouterr().out
    assert str(rec_file) in out
    assert f"report and auto read the checkout's {PKG.parent.resolve() / 'data'}, not this folder" in out
    assert {json.loads(line)["impl"] for line in rec_file.read_text().splitlines()} >= {"warp_uncached",
                                                                                        "torch_compact"}
    assert {p: p.stat().st_mtime for p in PKG.rglob("*.jsonl*")} == before


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                 "tried to allocate 409600000000 bytes. Error code 12 (Cannot allocate memory)"),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 381.47 GiB."), MemoryError()],
    ids=["cpu", "cuda", "python"])
def test_running_out_of_memory_is_one_line_not_a_traceback(error, monkeypatch, capsys):
    """A batch the machine cannot hold (the allocators' own errors, raised where the step would allocate: a real
    400 GB request could be granted and then killed where memory is overcommitted): the allocator's words and what
    to change, exit 2. Any other error is not caught."""
    from fovi_lab import train

    def fail(*args, **kwargs):
        raise error
    monkeypatch.setattr(train, "train_digits", fail)
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--steps", "1", "--batch", "100000000", "--device", "cpu"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("python -m fovi_lab train: error: out of memory (") and \
        err.endswith("; try a smaller --batch\n"), err
    monkeypatch.setattr(train, "train_digits", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="^other$"):
        cli.main(["train", "--steps", "1", "--device", "cpu"])


def _no_new_files(monkeypatch):
    """A folder in which no file can be made (a read-only mount, another user's folder): what a run as root on a
    writable disk cannot show, so the probe's temporary file is refused as such a folder refuses it."""
    import tempfile

    def refuse(*args, dir=None, **kwargs):
        raise PermissionError(13, "Permission denied", str(dir))
    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)


OUT_COMMANDS = [leaf for leaf in LEAVES if leaf not in (["demo"], ["warmup"])]


@pytest.mark.parametrize("leaf", OUT_COMMANDS, ids=" ".join)
def test_a_records_file_that_cannot_be_written_is_refused_before_the_run(leaf, tmp_path, monkeypatch, capsys):
    """``--out`` in a folder where no file can be made: one line at the door, not a traceback after the timings."""
    _no_new_files(monkeypatch)
    code, err = _usage_error(leaf + ["--out", str(tmp_path / "r.jsonl")], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"--out: expected a file this process can write, got '{tmp_path / 'r.jsonl'}': no file can be made in " \
           f"'{tmp_path}': Permission denied" in err
    assert not (tmp_path / "r.jsonl").exists()


def test_the_write_probe_leaves_no_file_and_appends_to_an_existing_one(tmp_path):
    from fovi_lab.ops.arguments import unwritable
    assert unwritable(tmp_path / "a" / "b" / "r.jsonl") is None           # its folders are made with the records
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "r.jsonl"
    existing.write_text("{}\n")
    stamp = existing.stat().st_mtime_ns
    assert unwritable(existing) is None
    assert existing.read_text() == "{}\n" and existing.stat().st_mtime_ns == stamp
    if os.geteuid() != 0:                                                  # root writes a read-only file anyway
        existing.chmod(0o444)
        assert unwritable(existing).startswith("it cannot be appended to: Permission denied")


@pytest.mark.parametrize("argv", [["bench", "forward", "--layers", "res18_layer4_0", "--batches", "1"],
                                  ["bench", "train-step", "--layers", "res18_layer4_0", "--batches", "1"]],
                         ids=lambda a: a[1])
def test_a_default_records_file_that_cannot_be_written_is_refused_before_the_run(argv, tmp_path, monkeypatch,
                                                                                   capsys):
    """Without ``--out`` the records go to ``data/`` under the current folder: where that cannot be written, the
    command says so and asks for ``--out`` before it times anything."""
    pytest.importorskip("warp")
    monkeypatch.chdir(tmp_path)
    _no_new_files(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert f"python -m fovi_lab bench {argv[1]}: error: --out: the default {tmp_path / 'data'}" in err
    assert f"cannot be written (no file can be made in '{tmp_path}': Permission denied); name a file with " \
           f"--out (see --help)" in err
    assert "benchmark on" not in out and list(tmp_path.iterdir()) == []


def _installed(tmp_path) -> tuple:
    """The package copied as a wheel lays it out (``site/fovi_lab``, no checkout above it), a working folder and
    the environment that imports the copy."""
    site = tmp_path / "site"
    shutil.copytree(PKG, site / "fovi_lab", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1")
    return site, work, env


def _files(folder: Path) -> dict:
    return {p: p.stat().st_mtime for p in folder.rglob("*") if p.is_file()}


def test_an_installed_package_writes_under_the_current_folder_only(tmp_path):
    """A wheel install: the records of ``bench forward`` go to ``./data``, nothing is written into the install
    folder, no folder beside it is read as a data folder, and ``report`` says what it needs instead of crashing."""
    pytest.importorskip("warp")
    site, work, env = _installed(tmp_path)
    installed = _files(site)

    def fovi(*argv):
        return subprocess.run([sys.executable, "-m", "fovi_lab", *argv], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300)

    probe = subprocess.run([sys.executable, "-c", "import fovi_lab.ops.records as R; "
                                                  "print(R.__file__, R.CHECKOUT_ROOT, len(R.record_files()))"],
                           cwd=work, env=env, capture_output=True, text=True)
    where, root, n = probe.stdout.split()
    assert where.startswith(str(site)) and root == "None" and int(n) > 0, probe.stderr[-2000:]

    bench = fovi("bench", "forward", "--layers", "res18_layer4_0", "--batches", "1", "--reps", "1", "--warmup", "0",
                 "--no-cached", "--no-torch")
    assert bench.returncode == 0, bench.stderr[-2000:]
    (rec_file,) = (work / "data").glob("forward_*.jsonl")
    assert str(rec_file) in bench.stdout and rec_file.read_text().strip()
    assert f"an installed package reads only the records it ships: python -m fovi_lab report --data {work / 'data'}" \
        in bench.stdout

    report = fovi("report")
    assert report.returncode == 2 and report.stdout == ""
    assert report.stderr.count("\n") == 1 and "not run from a source checkout" in report.stderr
    assert "--out PATH" in report.stderr and "Traceback" not in report.stderr
    report = fovi("report", "--out", "results.md")
    assert report.returncode == 0, report.stderr[-2000:]
    assert (work / "results.md").read_text().startswith("# Results")
    assert _files(site) == installed


def test_report_writes_the_files_it_is_given(tmp_path, monkeypatch, capsys):
    """``--out`` and ``--readme`` name the files (the checkout's own stay as they are); a README without the table
    markers is a usage error."""
    from fovi_lab.bench import report
    from fovi_lab.ops.records import CHECKOUT_ROOT
    mine = [CHECKOUT_ROOT / "README.md", CHECKOUT_ROOT / "docs" / "results.md"] if CHECKOUT_ROOT else []
    before = {p: p.stat().st_mtime for p in mine}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text(f"# mine\n{report.README_BEGIN}\n{report.README_END}\n")
    assert cli.main(["report", "--out", "results.md", "--readme", "README.md"]) == 0
    assert "| layer |" in (tmp_path / "README.md").read_text() and (tmp_path / "results.md").is_file()
    assert {p: p.stat().st_mtime for p in mine} == before
    assert "wrote results.md" in capsys.readouterr().out
    (tmp_path / "plain.md").write_text("# no table here\n")
    code, err = _usage_error(["report", "--readme", "plain.md"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--readme: expected a README holding the lines" in err

"""The benchmarks that only a GPU times still run end to end on the CPU, and write the records they promise."""

import json

import pytest

pytest.importorskip("warp")


def test_dtype_bench_runs_and_checks_every_implementation(tmp_path):
    from fovi_lab.bench import dtypes
    out = tmp_path / "d.jsonl"
    assert dtypes.main(["--layers", "res18_layer4_0", "--batches", "2", "--reps", "1", "--no-graphs",
                        "--device", "cpu", "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["dtype"] for r in recs} == {"fp16", "bf16"} and {r["mode"] for r in recs} == {"forward", "train-step"}
    warp = [r for r in recs if r["impl"] in ("warp_compact", "warp_train")]
    assert len(warp) == 4 and all(r["note"] is None and r["ms"] > 0 for r in warp), warp


def test_compile_bench_runs_eager_and_compiled(tmp_path):
    from fovi_lab.bench import compile_step
    out = tmp_path / "c.jsonl"
    assert compile_step.main(["--net", "digits", "--backends", "torch_compact", "--batch", "8", "--reps", "2",
                              "--device", "cpu", "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["mode"] for r in recs] == ["eager", "compiled"] and all(r["ms"] > 0 for r in recs)
    assert recs[1]["compile_s"] > 0 and recs[0]["max_out_diff"] < 1e-4


def test_adjoint_paths_bench_checks_and_times_every_candidate(tmp_path):
    from fovi_lab.bench import adjoints
    out = tmp_path / "a.jsonl"
    assert adjoints.main(["--layers", "res18_layer4_0", "--batches", "3", "--rounds", "1", "--reps", "1",
                          "--device", "cpu", "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    grads = [r for r in recs if r["what"] in ("dx", "dW")]
    assert len(grads) == 2 * (2 + len(adjoints.split_configs()))
    assert all(r["note"] is None and r["ms"] > 0 and r["bitwise"] for r in grads), grads
    steps = {r["impl"]: r for r in recs if r["what"] == "step"}
    assert {"warp_train", "warp_train_mma", "warp_train_best", "torch_compact"} <= set(steps)
    assert all(r["note"] is None and r["ms"] > 0 for r in steps.values()), steps


def test_adjoint_paths_bench_refuses_a_path_switch(monkeypatch):
    from fovi_lab.bench import adjoints
    monkeypatch.setenv("FOVI_KNN_DX_PATH", "mma")
    with pytest.raises(SystemExit):
        adjoints.main(["--layers", "res18_layer4_0", "--batches", "3", "--device", "cpu"])


def test_adjoint_paths_bench_isolates_a_shape_and_records_one_that_overruns(tmp_path, capsys):
    from fovi_lab.bench import adjoints
    out = tmp_path / "a.jsonl"
    args = ["--layers", "res18_layer4_0", "--batches", "3", "--rounds", "1", "--reps", "1", "--device", "cpu",
            "--no-graphs", "--out", str(out)]
    assert adjoints.main(args + ["--shape-timeout", "0.2"]) == 0          # far too short: stopped, recorded
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["what"] == "shape" and rec["B"] == 3 and rec["note"].startswith("stopped after 0.2 s"), rec
    assert rec["stack"] and rec["stack"][0].startswith("File "), rec      # where the child was, from its faulthandler
    assert adjoints.main(args + ["--shape-timeout", "600"]) == 0          # in time: the child's records
    recs = [json.loads(line) for line in out.read_text().splitlines()][1:]
    assert {r["what"] for r in recs} == {"dx", "dW", "step"} and "dx fused" in capsys.readouterr().out


def test_records_say_how_the_tile_gemms_were_built(monkeypatch):
    from fovi_lab.bench.common import env_info, tile_gemm
    assert env_info("cpu")["tile_gemm"] == "scalar"          # Warp's CPU tiles have no cuBLASDx
    monkeypatch.setenv("FOVI_WARP_MATHDX", "0")
    assert tile_gemm("cuda") == "scalar"
    monkeypatch.setenv("FOVI_WARP_MATHDX", "1")
    assert tile_gemm("cuda") == "cuBLASDx"
    monkeypatch.delenv("FOVI_WARP_MATHDX")
    import warp
    monkeypatch.setattr(warp.config, "enable_mathdx_gemm", False, raising=False)
    assert tile_gemm("cuda") == "scalar"                      # unset: Warp's own setting decides


def test_records_say_which_kernel_switches_were_set(monkeypatch):
    from fovi_lab.bench.common import env_info
    import fovi_lab.settings as settings
    for name in settings.KERNEL_AFFECTING:
        monkeypatch.delenv(name, raising=False)
    assert env_info("cpu")["settings"] == {}                  # the package's own rules
    assert "note_run" not in env_info("cpu")
    monkeypatch.setenv("FOVI_WARP_MATHDX", "0")                # a build setting: recorded, the rules' own run
    info = env_info("cpu")
    assert info["settings"] == {"FOVI_WARP_MATHDX": "0"} and "note_run" not in info
    monkeypatch.setenv("FOVI_KNN_DX_PATH", "taps")             # an A/B switch: a variant, flagged for every reader
    monkeypatch.setenv("FOVI_KNN_UNRELATED_NAME", "1")         # not a setting: not recorded
    info = env_info("cpu")
    assert info["settings"] == {"FOVI_WARP_MATHDX": "0", "FOVI_KNN_DX_PATH": "taps"}
    assert info["note_run"] == "A/B switch FOVI_KNN_DX_PATH=taps"


def test_train_step_only_times_the_implementations_named(tmp_path, monkeypatch, capsys):
    """``--only warp_train`` under a switch: our step alone (no PyTorch form, no ratio to one), its records carrying
    the switch; a name the benchmark does not time is refused at the door."""
    import json
    from fovi_lab.bench.backward import main as bench_main

    monkeypatch.setenv("FOVI_KNN_DX_PATH", "taps")
    out = tmp_path / "only.jsonl"
    assert bench_main(["train-step", "--only", "warp_train", "--layers", "ODD", "--batches", "5", "--reps", "1",
                       "--warmup", "0", "--no-fovi", "--device", "cpu", "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["impl"] for r in recs] == ["warp_train"]
    r = recs[0]
    assert r["path"].startswith("dx taps") and r["settings"] == {"FOVI_KNN_DX_PATH": "taps"}
    assert r["deterministic"] and r["err_dx"] < 1e-3 and "speedup_vs_strongest" not in r
    assert r["tables_mib"] > 0, "what the layer keeps between calls: its index tables and the derived layers'"
    assert "not timed" in capsys.readouterr().out
    assert r["note_run"] == "A/B switch FOVI_KNN_DX_PATH=taps"        # a variant: every reader of records skips it
    with pytest.raises(SystemExit) as exc:
        bench_main(["train-step", "--only", "cuBLAS"])
    assert exc.value.code == 2 and "--only: expected an implementation this benchmark times" in capsys.readouterr().err
    for argv, wrong in ((["backward", "--only", "warp_train"], "warp_train is not timed by bench backward"),
                        (["train-step", "--only", "warp", "torch_compact"], "warp is not timed by bench train-step"),
                        (["backward", "--only", "fovi_cuda"], "fovi_cuda is not timed"),
                        (["train-step", "--only", "warp_dx"], "warp_dx is not timed")):
        with pytest.raises(SystemExit) as exc:
            bench_main(argv + ["--layers", "ODD", "--batches", "2", "--device", "cpu", "--out", str(out)])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and wrong in err and err.count("\n") == 1, err

"""The results table: docs/results.md and the README's table are what ``python -m fovi_lab report`` makes of the
committed records, and a row's two sides come from one run."""

from fovi_lab.bench import report
from fovi_lab.graph.layers import LAYERS


def test_committed_tables_equal_the_generated_ones():
    assert report.main(["--check"]) == 0


def test_rows_pair_ours_with_pytorch_of_the_same_run():
    rows = report.result_rows(report.load_runs())
    assert {r["mode"] for r in rows} == {"forward", "train-step"}
    fwd = [r for r in rows if r["mode"] == "forward"]
    # the 13 layers, the ResNet-18 stem on both frames (its rf1 network frame and the rf2 frame of earlier runs)
    assert {r["layer"] for r in fwd} == set(LAYERS) | {"res18_stem_rf2"}
    for r in rows:
        assert r["ours_ms"] and (r["torch_ms"] or r["torch_graphed_ms"]), r
        assert r["torch_impl"] is None or r["torch_impl"].startswith("torch_")


def test_the_readme_block_is_replaced_between_its_markers():
    text = f"a\n{report.README_BEGIN}\nold\n{report.README_END}\nb\n"
    assert report.update_readme(text, "new") == f"a\n{report.README_BEGIN}\nnew\n{report.README_END}\nb\n"
    try:
        report.update_readme("no markers", "new")
    except ValueError as e:
        assert "markers" in str(e)
    else:
        raise AssertionError("a README without the markers must be refused")


def test_network_rows_pair_ours_with_fovis_fastest_of_the_same_run(tmp_path):
    """A network row is one run's (device, net, B, precision, date) mode: fovi_lab against the fastest other backend of
    that run and mode only; a run without fovi_lab or without another backend gives no row; the README table takes
    the newest run of each network, batch and mode."""
    import json
    def rec(date, mode, backend, ms, net="resnet18"):
        return dict(kind="network", device="GPU X", net=net, B=64, precision="amp", date=date, mode=mode,
                    backend=backend, ms=ms, commit="abc")
    recs = [rec("2026-01-01T00:00", "eager", "fovi_lab", 10.0), rec("2026-01-01T00:00", "eager", "cuda", 12.0),
            rec("2026-01-01T00:00", "eager", "auto", 11.0), rec("2026-01-01T00:00", "graphed", "cuda", 3.0),
            rec("2026-01-02T00:00", "eager", "fovi_lab", 8.0), rec("2026-01-02T00:00", "eager", "baseline", 16.0),
            rec("2026-01-02T00:00", "eager", "fovi_lab", 5.0, net="alexnet"),
            dict(rec("2026-01-03T00:00", "eager", "fovi_lab", 1.0), in_res=24),     # a quick run, not the network
            dict(rec("2026-01-03T00:00", "eager", "cuda", 2.0), in_res=24)]
    (tmp_path / "gpu_x").mkdir()
    (tmp_path / "gpu_x" / "network.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    deep = tmp_path / "gpu_x" / "old" / "runs"        # deeper folders are not walked (--data /tmp stays quick)
    deep.mkdir(parents=True)
    (deep / "network.jsonl").write_text("".join(json.dumps(rec("2026-01-04T00:00", "eager", b, ms)) + "\n"
                                                for b, ms in (("fovi_lab", 1.0), ("cuda", 2.0))))    # a pair
    rows = report.network_rows(report.network_records(tmp_path))
    assert [(r["date"], r["mode"], r["ours_ms"], r["other"], r["other_ms"]) for r in rows] == [
        ("2026-01-01", "eager", 10.0, "auto", 11.0), ("2026-01-02", "eager", 8.0, "baseline", 16.0)]
    table = report.network_readme_table(rows)
    assert "| KNNResNet-18 | 64 | 8.00 / 16.00 (baseline) | 2.00x | – | – | – | – |" in table, table
    assert "KNNAlexNet" not in table
    assert "the build of our tile GEMMs (fused and staged adjoints) not recorded" in table
    for r in rows:
        r["tile_gemm"] = "scalar"
    assert "built as scalar loops, FOVI_WARP_MATHDX=0" in report.network_readme_table(rows)
    assert "| scalar |" in "\n".join(report.network_markdown(rows))
    rows[-1]["tile_gemm"] = "cuBLASDx"                  # the README shows the newest run only
    assert "on cuBLASDx, the default" in report.network_readme_table(rows)
    assert "built both ways" in report._tile_gemm_words(rows)
    text = f"a\n{report.NETWORK_BEGIN}\nold\n{report.NETWORK_END}\n"
    assert report.update_readme_networks(text, "new") == f"a\n{report.NETWORK_BEGIN}\nnew\n{report.NETWORK_END}\n"


def test_cpu_network_runs_go_to_the_results_page_only_naming_our_backend():
    """A CPU run (fovi_lab's auto against fovi's backends) is a row of docs/results.md, named by the backend ours ran,
    and never a row of the README's table, whose header names one GPU (the newest GPU run's)."""
    def rec(device, date, backend, ms, **kw):
        return dict(kind="network", device=device, net="resnet18", B=2, precision="fp32", date=date, mode="eager",
                    backend=backend, ms=ms, commit="abc", **kw)
    recs = [rec("GPU X", "2026-01-01T00:00", "fovi_lab", 4.0, tile_gemm="cuBLASDx"),
            rec("GPU X", "2026-01-01T00:00", "cuda", 6.0),
            rec("GPU Y", "2026-01-02T00:00", "fovi_lab", 3.0, tile_gemm="cuBLASDx"),
            rec("GPU Y", "2026-01-02T00:00", "cuda", 6.0),
            rec("cpu (x86_64)", "2026-01-03T00:00", "fovi_lab", 70.0, lab_backend="auto", tile_gemm="scalar"),
            rec("cpu (x86_64)", "2026-01-03T00:00", "baseline", 84.0)]
    rows = report.network_rows(recs)
    table = report.network_readme_table(rows)
    assert "GPU Y" in table and "cpu" not in table and "70.00" not in table and "3.00 / 6.00 (cuda)" in table
    page = "\n".join(report.network_markdown(rows))
    assert "| cpu (x86_64) | 2 | fp32 | eager | 70.00 (auto) | 84.00 (baseline) | 1.20 |" in page, page
    assert "| – (not run) | 2026-01-03 |" in page
    assert "| 3.00 | 6.00 (cuda) |" in page


def test_a_network_record_joins_the_run_it_names(tmp_path):
    """fovi_lab's record of a later call (``bench network --alternatives``) names the earlier call's run, whose fovi
    backends are its alternatives: one row, paired across the two calls."""
    import json
    base = dict(kind="network", device="GPU X", net="resnet18", B=64, precision="amp", mode="eager", commit="abc")
    recs = [dict(base, backend="cuda", ms=12.0, date="2026-01-01T00:00"),
            dict(base, backend="fovi_lab", ms=6.0, date="2026-01-01T00:09", run="2026-01-01T00:00")]
    (tmp_path / "gpu_x").mkdir()
    (tmp_path / "gpu_x" / "network.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows = report.network_rows(report.network_records(tmp_path))
    assert [(r["ours_ms"], r["other"], r["speedup"]) for r in rows] == [(6.0, "cuda", 2.0)]
    assert "6.00 / 12.00 (cuda) ‡" not in report.network_readme_table(rows)       # joined without saying so: no mark
    rows = report.network_rows([dict(r, alternatives="an earlier call") if r["backend"] == "fovi_lab" else r
                                for r in recs])
    assert "6.00 / 12.00 (cuda) ‡" in report.network_readme_table(rows)
    assert "(cuda) ‡" in "\n".join(report.network_markdown(rows))


def test_a_row_sets_ours_beside_pytorch_and_fovi_of_the_same_run():
    """A train-step row carries PyTorch's and fovi's fastest of its run (fovi's copy of the seed's warp_train is one
    of fovi's); its speedup is over the faster of the two, eager and replayed apart; the tables show fovi's columns
    only where a run timed fovi, and the README's step cells are eager / replayed."""
    from fovi_lab.graph.layers import layer_shape

    shape = {k: v for k, v in layer_shape("res18_layer1", "rf2").items()}

    def rec(impl, ms, b=16, date="2026-01-01T00:00", device="GPU X"):
        return dict(shape, layer="res18_layer1", B=b, mode="train-step", impl=impl, ms=ms, device=device,
                    date=date, source="s.jsonl", warp="1.19.0", torch="2.11")
    run = [rec("warp_train", 0.20), rec("warp_train_graphed", 0.10), rec("torch_compact", 0.50),
           rec("torch_binned_graphed", 0.30), rec("fovi_cuda", 0.40), rec("fovi_cuda_graphed", 0.08),
           rec("fovi_warp_train", 0.25), rec("fovi_baseline_graphed", 0.09)]
    plain = [rec("warp_train", 0.30, b=64), rec("torch_compact", 0.60, b=64)]
    rows = report.result_rows([("run a", run), ("run b", plain)])
    r = next(r for r in rows if r["B"] == 16)
    assert (r["torch_impl"], r["torch_graphed_impl"], r["fovi_impl"], r["fovi_graphed_impl"]) == (
        "torch_compact", "torch_binned", "warp_train", "cuda")
    assert report.best_other_ms(r, False) == 0.25 and report.best_other_ms(r, True) == 0.08
    assert abs(report.speedup(r, False) - 1.25) < 1e-12 and abs(report.speedup(r, True) - 0.8) < 1e-12
    r64 = next(r for r in rows if r["B"] == 64)
    assert r64["fovi_ms"] is None and abs(report.speedup(r64, False) - 2.0) < 1e-12
    assert report.speedup(r64, True) is None
    md = report.results_markdown(rows)
    # fovi's records without ``fovi_weight`` copied the weight in per timed call: marked, with a note
    assert "fovi's fastest, replayed" in md and "| 0.080 (cuda) † | 0.80 |" in md and "\n† fovi's timed calls" in md
    assert "| 0.250 (warp_train) † | 1.25 |" in md
    for rr in run:
        if rr["impl"].startswith("fovi_"):
            rr["fovi_weight"] = "set once, version bumped per step"
    md = report.results_markdown(report.result_rows([("run a", run), ("run b", plain)]))
    assert "| 0.080 (cuda) | 0.80 |" in md and "†" not in md
    assert "fovi's fastest, replayed" not in report.results_markdown([r64])
    table = report.readme_table(rows)
    assert "| res18_layer1 | – | – | – | – | 1.25 / 0.80 | 2.00 / – | – / – |" in table, table
    assert "or fovi's fastest backend, where the run timed them" in table
    # ahead eager at B = 16 (1.25) and 64 (2.0); replayed at neither (0.8, not recorded)
    assert report.steps_ahead(rows, "GPU X") == (
        "on the GPU X (fovi's backends among the alternatives on 1 layer at B = 16), eager 1, 1, 0, replayed 0, 0, 0")


def test_a_network_row_splits_the_step_where_the_run_timed_the_rest(tmp_path):
    """``bench network``'s stubbed row is the rest of the step, not an alternative: it is never fovi's fastest, and the
    KNN layers' share is each step less it."""
    import json

    def rec(mode, backend, ms):
        return dict(kind="network", device="GPU X", net="resnet18", B=64, precision="amp", date="2026-01-01T00:00",
                    mode=mode, backend=backend, ms=ms, commit="abc")
    recs = [rec("eager", "fovi_lab", 10.0), rec("eager", "cuda", 12.0), rec("eager", "stubbed", 6.0),
            rec("graphed", "fovi_lab", 4.0), rec("graphed", "cuda", 5.0)]
    (tmp_path / "gpu_x").mkdir()
    (tmp_path / "gpu_x" / "network.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows = report.network_rows(report.network_records(tmp_path))
    eager = next(r for r in rows if r["mode"] == "eager")
    assert eager["other"] == "cuda" and eager["rest_ms"] == 6.0
    assert report._knn_cell(eager) == "4.00 / 6.00 (1.50x)"
    assert report._knn_cell(next(r for r in rows if r["mode"] == "graphed")) == "–"
    assert "| 6.00 | 4.00 / 6.00 (1.50x) | – | – |" in "\n".join(report.network_markdown(rows))


def test_the_peak_columns_put_ours_against_fovis_cuda(tmp_path):
    """The peak over the run (``peak_run_mib``) of fovi_lab and of fovi's ``cuda`` per network, batch and mode: a
    timed run's before a memory-traced one's (fewer steps), the newest of each kind; – where either is missing."""
    import json

    def rec(mode, backend, ms, date="2026-01-01T00:00", **kw):
        return dict(kind="network", device="GPU X", net="resnet18", B=64, precision="amp", date=date,
                    mode=mode, backend=backend, ms=ms, commit="abc", **kw)
    recs = [rec("eager", "fovi_lab", 10.0, peak_run_mib=600.0), rec("eager", "cuda", 12.0, peak_run_mib=400.0),
            rec("eager", "fovi_lab", 30.0, "2026-01-02T00:00", peak_run_mib=500.0, note_run="memory trace"),
            rec("graphed", "fovi_lab", 4.0, peak_run_mib=450.0), rec("graphed", "auto", 5.0, peak_run_mib=300.0)]
    (tmp_path / "gpu_x").mkdir()
    (tmp_path / "gpu_x" / "network.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows = report.network_rows(report.network_records(tmp_path))
    table = report.network_readme_table(rows)
    row = "| KNNResNet-18 | 64 | 10.00 / 12.00 (cuda) | 1.20x | 4.00 / 5.00 (auto) | 1.25x | 600 / 400 (1.50x) | – |"
    assert row in table, table


def test_records_under_a_kernel_switch_stay_out_of_the_tables(tmp_path):
    """A run with a kernel switch set (``FOVI_KNN_DX_PATH=taps``, say: its records' ``settings``) measured a variant,
    not what ``warp_train`` runs; neither the per-layer nor the network table reads it."""
    import json
    base = dict(kind="network", device="GPU X", net="resnet18", B=64, precision="amp", mode="eager", commit="abc",
                date="2026-01-01T00:00")
    recs = [dict(base, backend="cuda", ms=12.0), dict(base, backend="fovi_lab", ms=6.0),
            dict(base, backend="fovi_lab", ms=1.0, settings={"FOVI_KNN_DX_PATH": "taps"})]
    (tmp_path / "gpu_x").mkdir()
    (tmp_path / "gpu_x" / "network.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows = report.network_rows(report.network_records(tmp_path))
    assert [(r["ours_ms"], r["other_ms"]) for r in rows] == [(6.0, 12.0)]
    step = dict(mode="train-step", device="GPU X", layer="res18_stem", B=16, date="2026-01-01T00:00", source="s")
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        dict(step, impl="warp_train", ms=0.5), dict(step, impl="torch_compact", ms=0.4),
        dict(step, impl="warp_train", ms=0.1, settings={"FOVI_KNN_DX_PATH": "taps"}))))
    runs = report.load_runs(tmp_path)
    assert sorted(r["ms"] for _, recs in runs for r in recs) == [0.4, 0.5]
    # a build or memory setting is no variant: the package's own rules ran, on a build the record names
    assert not report.switched_variant(dict(settings={"FOVI_WARP_MATHDX": "0", "FOVI_KNN_STAGE_MIB": "128"}))
    assert not report.switched_variant(dict(settings={"FOVI_KNN_DX_PATH": "auto"}))     # the default, spelled out
    assert not report.switched_variant(dict(settings={"FOVI_KNN_DX_PATH": ""}))         # empty: unset
    assert not report.switched_variant({})
    assert report.switched_variant(dict(settings={"FOVI_WARP_MMA": "off"}))
    assert report.switched_variant(dict(settings={"FOVI_KNN_DX_PATH": "AUTO"}))         # refused by the variable
    assert report.switched_variant(dict(settings={"FOVI_NOT_A_SETTING": "1"}))          # unknown: not the rules'

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
            rec("2026-01-02T00:00", "eager", "fovi_lab", 5.0, net="alexnet")]
    (tmp_path / "gpu_x").mkdir()
    (tmp_path / "gpu_x" / "network.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rows = report.network_rows(report.network_records(tmp_path))
    assert [(r["date"], r["mode"], r["ours_ms"], r["other"], r["other_ms"]) for r in rows] == [
        ("2026-01-01", "eager", 10.0, "auto", 11.0), ("2026-01-02", "eager", 8.0, "baseline", 16.0)]
    table = report.network_readme_table(rows)
    assert "| KNNResNet-18 | 64 | 8.00 / 16.00 (baseline) | 2.00x | – | – |" in table, table
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

"""The headless main job: every registered backend on a real fovi layer agrees with the oracle."""

from fovi_lab.demo import format_rows, main, run_demo
from fovi_lab.ops.autograd import OPS_REGISTRY


def test_demo_runs_every_registered_backend_on_a_real_layer():
    rows = run_demo("res18_layer2_0", batch=3, reps=1, log=lambda *_: None)
    assert {r.backend for r in rows} == set(OPS_REGISTRY)
    table = format_rows(rows)
    for r in rows:
        assert r.ok, table
        assert r.fwd_err is not None and r.fwd_ms is not None
    compact = next(r for r in rows if r.backend == "torch_compact")
    assert compact.dx_err is not None and compact.dw_err is not None


def test_demo_cli_rejects_bad_arguments(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--batch", "0"])
    with pytest.raises(SystemExit):
        main(["--layer", "no_such_layer"])

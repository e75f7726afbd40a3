"""The headless main job: every registered backend on a real fovi layer agrees with the oracle."""

import time

import pytest
import torch

from fovi_lab import demo
from fovi_lab.demo import cpu_estimate, estimate_line, format_rows, main, pass_flops, run_demo
from fovi_lab.ops.autograd import OPS_REGISTRY
from fovi_lab.ops.reference import CompactTorchOps


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
    for argv in (["--batch", "0"], ["--layer", "no_such_layer"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_on_the_cpu_pytorch_runs_fp32_and_each_dtype_has_one_set_of_references(monkeypatch):
    """The PyTorch backends compute in fp32 on the CPU (fp16 matrix products are slow there), the Warp ones keep
    fp16; the oracle runs once in fp64 and once in the dtype per dtype, not per backend."""
    calls = []
    real = demo.oracle_forward
    monkeypatch.setattr(demo, "oracle_forward",
                        lambda *a, dtype, **k: calls.append(dtype) or real(*a, dtype=dtype, **k))
    rows = run_demo("res18_layer4_0", batch=2, reps=1, device="cpu", log=lambda *_: None,
                    backends=["torch_compact", "torch_binned", "warp_compact", "warp_train"])
    assert {r.backend: r.dtype for r in rows} == {"torch_compact": "float32", "torch_binned": "float32",
                                                  "warp_compact": "float16", "warp_train": "float16"}
    assert all(r.ok for r in rows), format_rows(rows)
    assert sorted(map(str, calls)) == sorted(["torch.float64", "torch.float32", "torch.float64", "torch.float16"])


def test_the_cpu_estimate_grows_with_the_work_and_names_a_batch_that_fits():
    plan = [("torch_compact", torch.float32, True), ("warp_compact", torch.float16, False),
            ("warp_train", torch.float16, True)]
    one = cpu_estimate(pass_flops(8, 230, 2432, 256), plan, reps=3)
    assert cpu_estimate(pass_flops(64, 230, 2432, 256), plan, reps=3) == pytest.approx(8 * one)
    assert cpu_estimate(pass_flops(8, 230, 2432, 256), plan, reps=9) > one
    # the references run once per dtype: a second fp32 backend adds its own passes only
    two = cpu_estimate(pass_flops(8, 230, 2432, 256), plan + [("torch_binned", torch.float32, True)], reps=3)
    assert two - one < cpu_estimate(pass_flops(8, 230, 2432, 256), [("torch_binned", torch.float32, True)], reps=3)
    # one pass of alex_L1 at B = 64 is 18.3 GFLOP; at 1 GFLOP/s a pass, 30 passes take 9 minutes
    flops = pass_flops(64, 230, 2432, 256)
    assert flops == pytest.approx(18.33e9, rel=1e-3)
    assert estimate_line("alex_L1", 64, 30 * flops / 1e9, flops) == \
        ("alex_L1 at B = 64 on the CPU: about 9 minutes (~18.3 GFLOP per pass, not counting Warp's compilation); "
         "try --batch 4")
    assert estimate_line("alex_L1", 8, 45.0, flops / 8) == \
        "alex_L1 at B = 8 on the CPU: about 45 s (~2.29 GFLOP per pass, not counting Warp's compilation)"


def test_a_long_cpu_run_says_so_first_and_each_long_phase_as_it_starts(monkeypatch):
    monkeypatch.setattr(demo, "CPU_GFLOPS", {k: 1e-4 for k in demo.CPU_GFLOPS})   # a CPU this slow: minutes
    monkeypatch.setattr(demo, "_LONG_PHASE_S", 0.0)     # the timing's estimate comes from its first timed call
    lines = []
    run_demo("res18_layer4_0", batch=2, reps=2, device="cpu", backends=["torch_compact"], log=lines.append)
    (warning,) = [i for i, ln in enumerate(lines) if "on the CPU: about" in ln]
    assert " minutes (~" in lines[warning] and lines[warning].endswith("try --batch 1")
    first = next(i for i, ln in enumerate(lines) if "torch_compact" in ln)
    assert warning < first
    starts = [i for i, ln in enumerate(lines) if "torch_compact: " in ln]          # as each phase starts
    ends = [i for i, ln in enumerate(lines) if "torch_compact   " in ln]           # as it ends, with its time
    assert [lines[i].split("torch_compact: ")[1].split(",")[0].split(":")[0] for i in starts] == [
        "fp64 and float32 references (forward and both gradients)", "forward", "dx and dW",
        "timing the forward", "timing dx and dW"]
    assert all("about" in lines[i] and lines[i].endswith("...") for i in starts)
    assert [lines[i].split("   ")[-1].split(" (")[0] for i in ends] == [
        "fp64 and same-dtype oracle references", "forward, first call", "dx and dW, first call", "timed, median of 2"]
    assert all(s < e for s, e in zip(starts, ends)) and all(e < s for e, s in zip(ends, starts[1:4]))
    assert starts[-1] < ends[-1]                         # the timing's estimates come inside its phase
    assert all("for the other 1 ..." in lines[i] for i in starts[3:])


class _SlowFirstCalls(CompactTorchOps):
    """torch_compact whose first call of each method takes 1 s more (as a compile, or a table built once); the
    later calls return the first's result after ``every_call_s``, so their time is known."""
    name = "slow_first_calls"
    done: dict = {}
    every_call_s = 0.0

    @classmethod
    def _call(cls, what, *a):
        if what not in cls.done:
            time.sleep(1.0)
            cls.done[what] = getattr(CompactTorchOps, what)(*a)
        time.sleep(cls.every_call_s)
        return cls.done[what]

    @classmethod
    def forward(cls, *a):
        return cls._call("forward", *a)

    @classmethod
    def grad_input(cls, *a):
        return cls._call("grad_input", *a)

    @classmethod
    def grad_weight(cls, *a):
        return cls._call("grad_weight", *a)


@pytest.mark.parametrize("every_call_s", [0.0, 0.15])
def test_the_timing_estimate_comes_after_the_first_calls(monkeypatch, every_call_s):
    """A backend's first calls (1 s more here) say nothing of the timed ones: no estimate from them. Where the
    warm calls are slow (0.15 s a call), the first timed call of each pass gives the estimate of the others."""
    ops = type("Slow", (_SlowFirstCalls,), dict(done={}, every_call_s=every_call_s))
    monkeypatch.setitem(OPS_REGISTRY, ops.name, ops)
    monkeypatch.setattr(demo, "_LONG_PHASE_S", 0.2)
    lines = []
    rows = run_demo("res18_layer4_0", batch=2, reps=3, device="cpu", backends=[ops.name], log=lines.append)
    assert rows[0].ok, format_rows(rows)
    timing = [ln for ln in lines if ": timing" in ln]
    if not every_call_s:
        assert timing == []                              # 2 more calls of a fast pass: nothing to announce
        return
    assert [ln.split(": timing ")[1].split(":")[0] for ln in timing] == ["the forward", "dx and dW"]
    for ln in timing:
        took = float(ln.split("one call took ")[1].split(" s")[0])
        assert 0.1 <= took < 0.9 and ln.endswith("for the other 2 ...")     # a warm call's time, not the first's
    first_calls = max(i for i, ln in enumerate(lines) if "first call (" in ln)
    assert all(lines.index(ln) > first_calls for ln in timing)

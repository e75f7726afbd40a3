"""The registry of forward kernel families: every preset is a point of its family's space (and back, field for
field), names are derived from parameters and read in words, the checks agree with the kernel factories, a point
no preset names runs through the public entry point and matches the oracle, and ``explain`` says what the
production rules pick and why the other families are not it."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest
import torch

import fovi_lab
from fovi_lab.graph.meta import build_meta, synthetic_graph
from fovi_lab.kernels import forward as F
from fovi_lab.kernels.families import (DEVICES, FAMILIES, PRESETS, Problem, aliases, config_of, describe,
                                       device_spec, family, lookup)
from fovi_lab.kernels.forward.configs import FwdConfig, _TABLES
from fovi_lab.ops.reference import oracle_forward

NAMED = [n for n, p in PRESETS.items() if p.point is not None]


def test_every_configs_table_entry_is_a_preset_of_one_family():
    table = {n: spec for sec in _TABLES.values() for n, spec in sec.items()}
    assert set(PRESETS) == set(table)
    # the canary's oversized test config lies outside every space, on purpose
    assert [n for n, p in PRESETS.items() if p.point is None] == ["test_oversized"]
    # 23 family strings of the configs table are the variants of 7 families
    assert len(FAMILIES) == 7 and {v for f in FAMILIES for v in f.variants} == {s[0] for s in table.values()}


@pytest.mark.parametrize("name", NAMED)
def test_preset_round_trips_field_for_field(name):
    table = {n: spec for sec in _TABLES.values() for n, spec in sec.items()}
    pt = PRESETS[name].point
    fam = family(pt.family)
    assert fam.to_config(pt, name) == FwdConfig(name, *table[name])
    assert F.config_spec(name) == FwdConfig(name, *table[name])
    assert pt.id == name and lookup(name) == pt
    assert lookup(fam.format_id(pt, explicit=True)) == pt          # the fully written id names the same point
    assert fam.combine_reasons(pt) == []


def test_names_are_unique_words_and_aliases_resolve():
    names = [describe(n) for n in NAMED]
    assert len(set(names)) == len(names)
    config_id = re.compile(r"\b(mma\w*|sd|sv|ss|nm\w*|i2c\w*|gp)_[a-z]?\d|\bm\d+n\d+")
    assert not [n for n in names if config_id.search(n)]
    al = aliases()
    assert al["m64n64"] == "m64n64r1" and al["nm_m64n64k64r2b256"] == "nm_m64n64k64r2"
    for derived, name in al.items():
        assert lookup(derived) == lookup(name) and derived not in PRESETS


def test_ids_of_points_no_preset_names_never_collide_with_a_preset():
    fam = family("tile_gemm")
    pt = fam.point(tile_m=16, tile_n=32, r=1, warps=4, prefetch=False)     # "m16n32" is the 2-warp preset
    assert lookup("m16n32") != pt and pt.id == "m16n32r1b128" and lookup(pt.id) == pt
    tc = family("tensor_cores")
    new = tc.point(tile_o=48, tile_b=32, k=32, warps=4, x_layout="transposed", w_layout="transposed", split=False,
                   store="direct")
    assert new.id == "mmat_o48b32k32" and lookup(new.id) == new
    assert describe(new) == "tensor cores, 48 channels x 32 rows per warp, 32 p entries per step, x^T layout"


@pytest.mark.parametrize("bad, match", [
    ("m7n7", "tile_m .* must be one of"),
    ("mmast_o64b16", "a preset name"),
    ("mmap_o256b256k64s6", "393216 bytes of shared memory"),
    ("zz", "a preset name"),
])
def test_unknown_or_impossible_ids_say_why(bad, match):
    with pytest.raises(ValueError, match=f"config: unknown forward config '{bad}'.*{match}"):
        F.config_spec(bad)


def test_point_arguments_are_checked_by_name():
    tc = family("tensor_cores")
    with pytest.raises(ValueError, match="unknown parameter"):
        tc.point(tile_x=1)
    with pytest.raises(ValueError, match="missing value"):
        tc.point(tile_o=64)
    pt = lookup("mma_o64b16")
    with pytest.raises(ValueError, match="tile_b .* must be one of 8, 16, 32, 64, got 12"):
        pt.replace(tile_b=12)
    split_xt = pt.replace(split=True, x_layout="transposed")
    assert any("no kernel combines" in r for r in tc.check(split_xt))
    with pytest.raises(ValueError, match="no kernel combines"):
        tc.to_config(split_xt)


def test_pipelined_checks_agree_with_the_kernel_factory():
    """Every point of the pipelined space: the family accepts it exactly when the factory builds it (the register
    policy aside, which the factory does not have)."""
    from fovi_lab.kernels.forward.mma_pipe import make_mma_pipe_kernel
    fam = family("pipelined")
    import itertools
    for combo in itertools.product(*(p.values for p in fam.params)):
        pt = fam.point(**dict(zip((p.name for p in fam.params), combo)))
        reasons = fam.combine_reasons(pt)
        try:
            make_mma_pipe_kernel(pt["channels"], pt["rows"], pt["k"], pt["stages"], pt["warps"] * 32,
                                 split=pt["split"])
            built = True
        except ValueError:
            built = False
        policy = [r for r in reasons if "accumulators" in r]
        assert built == (not reasons or bool(policy)), (pt, reasons)


def test_tensor_core_checks_agree_with_the_kernel_factory():
    from fovi_lab.kernels.forward.mma import make_mma_kernel
    fam = family("tensor_cores")
    tried = 0
    for pt in list(fam.points())[::37]:                      # a spread of the 2,000-odd points
        cfg = fam.to_config(pt)
        split, w_native, x_t = F.mma_flags(cfg.variant)
        make_mma_kernel(cfg.tile_n // 16, cfg.tile_m // 8, cfg.block_dim, split=split, w_native=w_native, x_t=x_t,
                        k_steps=cfg.tile_k // 16, stage=F.mma_staged(cfg.variant))
        tried += 1
    assert tried > 50


def test_shared_memory_and_architecture_checks_name_the_device():
    a100, h200, cpu = DEVICES["a100"], DEVICES["h200"], DEVICES["cpu"]
    old = DEVICES["h200"].__class__("an sm_75 GPU", 75, sms=40, smem_per_block=64 * 1024)
    assert any("needs sm_80 or newer; an sm_75 GPU is sm_75" in r for r in family("tensor_cores").check(
        lookup("mma_o64b16"), device=old))
    big = family("tile_gemm").point(tile_m=128, tile_n=128, r=4, warps=8, prefetch=False)
    assert any("KiB of shared memory, over the 163 KiB" in r for r in family("tile_gemm").check(big, device=a100))
    assert any("over the 256 KiB" in r for r in family("tile_gemm").check(big, device=cpu))
    assert family("tensor_cores").check(lookup("mmato_o64b32b256"), device=h200) == []


def _meta(node_major: bool = True):
    idx, rf = synthetic_graph(40, 24, 9, 11, 0.2, seed=3)
    meta = build_meta(idx, rf, cin=8, cout=40, v=11, nin=40)
    if not node_major:        # the same operator with the table columns permuted: no longer node-major
        perm = torch.randperm(meta.p64, generator=torch.Generator().manual_seed(0))
        meta.input_linear = meta.input_linear[:, perm].contiguous()
        meta.weight_linear = meta.weight_linear[:, perm].contiguous()
    return meta


def test_problem_reasons():
    nm = family("node_major")
    pt = lookup("nm_m64n64k64")
    assert nm.check(pt, Problem.of(_meta(True), 8)) == []
    assert nm.check(pt, Problem.of(_meta(False), 8)) == [
        "needs node-major index tables, built as in docs/operator.md §2.1 (input_linear[n, c*K+k] = c*Nin + idx[n, k]); "
        "these are not"]
    bf = Problem.of(_meta(True), 8, torch.bfloat16)
    assert nm.check(pt, bf) == ["has kernels for fp16 only, not bfloat16"]
    assert family("tensor_cores").check(lookup("mma_o64b16"), bf) == []
    i2c = family("im2col")
    p192 = Problem(batch=8, cin=8, nin=40, cout=40, nout=24, p64=192, q=88)
    assert i2c.check(lookup("i2c_m64n64k128"), p192) == [
        "steps 128 p entries at a time, but P64=192 is not a multiple of 128; pick a 64-deep config or leave config=None"]
    assert i2c.check(lookup("i2c_m64n64k64"), p192) == []


def test_estimate_is_the_padded_roofline():
    p = Problem(batch=17, cin=64, nin=230, cout=64, nout=230, p64=576, q=576, k=9)
    h200, a100 = device_spec("h200"), device_spec("a100")
    tc = family("tensor_cores")
    e = tc.estimate(lookup("mma_o64b16"), p, h200)               # B = 17 pads to 32 rows of 16
    flops = 2.0 * 32 * 576 * 64 * 230
    t = max(flops / 989.4e12, e.nbytes / 4.8e12) * 1e3
    assert e.flops == flops and math.isclose(e.ms, t)
    # the transposed layouts and the split partials are bytes on top of the fewest
    assert tc.estimate(lookup("mmat_o64b32"), p, h200).nbytes > e.nbytes == p.fewest_bytes + 2 * 2 * 64 * 576
    assert family("simt").estimate(lookup("sd_b8o8u4"), p, a100).peak.endswith("19.5 TFLOP/s fp32 CUDA-core peak")
    none = tc.estimate(lookup("mma_o64b16"), p, device_spec("cpu"))
    assert none.ms is None and "no roofline for cpu" in none.words()


def test_a_point_no_preset_names_runs_and_matches_the_oracle():
    """The widget's promise: any valid point builds, passes the canary and computes the operator."""
    meta = _meta(True)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(19, meta.cin, meta.nin, generator=g).half()
    w = (torch.randn(meta.cout, meta.q, generator=g) / 8).half()
    bias = torch.randn(meta.cout, generator=g).half()
    name = "mmat_o48b32k32"
    assert name not in PRESETS
    plan = F.prepare_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=name)
    plan.out.fill_(float("nan"))
    plan.launch()
    y = plan.finish()
    ref = oracle_forward(x, w, bias, meta.idx, meta.rf_index, meta.v)
    ref16 = oracle_forward(x, w, bias, meta.idx, meta.rf_index, meta.v, dtype=torch.float16)
    tol = 3 * float((ref16.float() - ref).abs().max()) + 2e-3
    assert plan.config == name and torch.isfinite(y).all()
    assert float((y.float() - ref).abs().max()) <= tol
    assert config_of(name) == F.config_spec(name)


@pytest.mark.parametrize("layer, batch, dtype, device", [
    ("alex_L1", 64, "fp16", "h200"), ("res18_layer4_0", 16, "fp16", "cpu"), ("alex_L0", 4, "bf16", "a100"),
    ("res18_layer1", 512, "fp16", "h100"),
])
def test_explain_reports_the_production_picks(layer, batch, dtype, device):
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.knn_warp import grad_paths
    from fovi_lab.kernels.forward.rules import select_config, select_mma
    meta = layer_meta(layer)
    ex = fovi_lab.explain(layer, batch, dtype, device)
    want = (select_mma(batch, meta.cout, meta.nout, meta.p64, meta.q, pipe=False) if dtype == "bf16" else
            select_config(batch, meta.cout, meta.nout, meta.p64, in_channels=meta.cin,
                          node_major=ex.problem.node_major, q=meta.q))
    assert ex.forward.id == want
    text = str(ex)
    assert f"[{want}]" in text and describe(want) in text
    paths = grad_paths(meta, batch, torch.bfloat16 if dtype == "bf16" else torch.float16)
    assert ex.dx.startswith({"mma": "tensor cores", "fused": "fused", "staged": "staged"}[paths[0]])
    chosen = [v for v in ex.families if v.status == "chosen"]
    assert len(chosen) == 1 and chosen[0].family == ex.forward.family
    for v in ex.families:
        assert v.reasons or v.status == "chosen"
        if dtype == "bf16" and v.family != "tensor_cores" and v.status != "not a training kernel":
            assert v.status == "cannot run" and "fp16 only" in v.reasons[0]
    if device == "cpu":
        assert "no roofline for cpu" in text
    else:
        assert "TFLOP/s" in text and ex.forward_estimate.ms > 0


def test_explain_on_tables_that_are_not_node_major():
    ex = fovi_lab.explain(_meta(False), 8)
    nm = [v for v in ex.families if v.family == "node_major"][0]
    assert nm.status == "cannot run" and "node-major index tables" in nm.reasons[0]


def test_explain_and_configs_commands(capsys):
    from fovi_lab.cli import main
    assert main(["explain", "--layer", "res18_layer1", "--batch", "16", "--device", "h200"]) == 0
    out = capsys.readouterr().out
    assert "forward: tensor cores" in out and "families:" in out
    for argv, msg in ((["explain", "--device", "h300"], "--device: expected cpu, cuda[:i] or one of h200"),
                      (["explain", "--layer", "nope"], "--layer: unknown layer 'nope'"),
                      (["explain", "--batch", "0"], "--batch: expected an integer >= 1"),
                      (["explain", "--device", f"cuda:{torch.cuda.device_count()}"],
                       "--device: 'cuda:" if torch.cuda.is_available() else "and this machine has none")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and msg in err, err
    assert main(["configs", "--family", "pipelined"]) == 0
    out = capsys.readouterr().out
    assert "mmap_o128b64k32s3      tensor cores, cp.async pipeline, 128 channels x 64 rows per block" in out


def test_docs_kernels_md_is_what_the_registry_gives():
    from pathlib import Path
    from fovi_lab.kernels.families.listing import render_markdown
    doc = Path(__file__).resolve().parents[3] / "docs" / "kernels.md"
    assert doc.read_text() == render_markdown(), (
        "docs/kernels.md differs from the registry: run python -c "
        "'from fovi_lab.kernels.families.listing import write_docs; write_docs()'")


def test_explain_says_whose_records_auto_reads():
    from fovi_lab.ops.devices import DeviceSpec
    pcie = DeviceSpec("NVIDIA H100 PCIe", 90, sms=114, smem_per_block=227 * 1024)     # no records of its own
    assert "(the same sm_90)" in fovi_lab.explain("res18_layer1", 64, device=pcie).auto
    assert "in its own records" in fovi_lab.explain("res18_layer1", 64, device="h100").auto
    assert fovi_lab.explain("res18_layer1", 64, device="h200").auto.startswith("warp_train for training, the fastest "
                                                                                "in its own records")
    # no record of an sm_80 GPU: the cost model prices the backends on the A100's datasheet peaks
    a100 = fovi_lab.explain("res18_layer1", 64, device="a100").auto
    assert a100.startswith("warp_train: no train-step record") and "the cost model's estimates" in a100
    assert "beside it, the cost model's estimates on NVIDIA H100" in fovi_lab.explain("res18_layer1", 64,
                                                                                     device="h100").auto


# -- decisions through the families, not string branches -------------------------------------------------------------
def _kernel_words() -> set:
    """Every string that names a kernel family, a variant, an adjoint kind or a dataflow a family declares."""
    from fovi_lab.kernels.families.registry import ADJOINT_FAMILIES, presets
    words = set()
    for fam in list(FAMILIES) + list(ADJOINT_FAMILIES):
        words |= {fam.key, *fam.variants, *getattr(fam, "kinds", ())}
    configs = set(F.uncached_config_names(experimental=True)) | set(F.cached_config_names())
    for fam in FAMILIES:
        words |= {fam.dataflow(F.config_spec(p.name)) for p in presets(fam.key) if p.name in configs}
    return words - {""}


_SUBJECTS = ("kind", "family", "variant", "fam", "key", "flow", "dataflow")


def kind_branches(source: str, words: set) -> list:
    """``(line, text)`` of each comparison of a kind, family or dataflow (a name or attribute spelt as in
    :data:`_SUBJECTS`) with string literals naming kernels (``kind == "gi"``, ``cfg.variant in ("mmap", "mmaps")``)."""
    def literals(node):
        elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and all(isinstance(o, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for o in node.ops):
            subject = node.left.attr if isinstance(node.left, ast.Attribute) else getattr(node.left, "id", "")
            if subject in _SUBJECTS and any(w in words for c in node.comparators for w in literals(c)):
                out.append((node.lineno, ast.unparse(node)))
    return out


def test_kernel_decisions_go_through_the_families():
    """Outside ``kernels/families/`` code asks a family (its parameters, ``dataflow``, ``mma_sync``, ``grid``...)
    instead of comparing kind or family strings. What is left: the forward plans' one dispatch on the dataflow the
    family declares (one arm per operand layout)."""
    pkg = Path(fovi_lab.__file__).resolve().parent
    words = _kernel_words()
    found = {}
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        if not rel.startswith("kernels/families/"):
            hits = kind_branches(path.read_text(), words)
            if hits:
                found[rel] = hits
    assert set(found) <= {"kernels/forward/plans.py"}, found
    assert sum(map(len, found.values())) <= 6, found


def test_the_branch_check_finds_kind_branches():
    words = {"gi", "gw", "mmap", "mmaps"}
    src = ('if kind == "gi": pass\nx = a if cfg.variant in ("mmap", "mmaps") else b\nif which == "gi": pass\n'
           'if kind == "other": pass\n')
    assert kind_branches(src, words) == [(1, "kind == 'gi'"), (2, "cfg.variant in ('mmap', 'mmaps')")]

"""The adjoint kernel families: every name the adjoint build and plan modules take is a point of one family and back
(the name derived from the parameters is the name), each kernel keeps the tiles it was declared with, a point that
cannot run says why, and the names read in words."""

from __future__ import annotations

import re

import pytest
import torch

from fovi_lab.graph.meta import build_meta, synthetic_graph
from fovi_lab.kernels.families import DEVICES, Problem, describe, family
from fovi_lab.kernels.families import registry as R
from fovi_lab.kernels.families.table import _ADJOINT_TABLES

# The adjoint configs as the build and plan modules read them: name -> (version, tile_p, columns, step, block_dim)
# for the staged stage kernels (columns: batch rows for gi, output channels for gw; step: Cout for gi, batch rows
# for gw), (tile, tile, step, block_dim) for the fused ones. A name here must keep naming these tiles.
STAGED_DX = {
    "gi2_p64b128": (2, 64, 128, 64, 256), "gi2_p64b64": (2, 64, 64, 64, 128), "gi2_p32b128": (2, 32, 128, 64, 128),
    "gi2_p64b256": (2, 64, 256, 64, 256), "gi2_p64b128o128": (2, 64, 128, 128, 256),
    "gi2p_p64b128": ("2p", 64, 128, 64, 256), "gi2p_p64b64": ("2p", 64, 64, 64, 128),
    "gi3_p64b128": (3, 64, 128, 64, 256), "gi3_p64b64": (3, 64, 64, 64, 128),
    "gi3p_p64b128": ("3p", 64, 128, 64, 256), "gi3p_p64b64": ("3p", 64, 64, 64, 128),
    "gi2i_p64b64": ("2i", 64, 64, 64, 128), "gi3i_p64b128": ("3i", 64, 128, 64, 256),
    "gi2i_p64b64o96": ("2i", 64, 64, 96, 128), "gi3i_p64b128o96": ("3i", 64, 128, 96, 256),
    "gi2i_p64b16o96": ("2i", 64, 16, 96, 128),
}
STAGED_DW = {
    "gw2_p64n64": (2, 64, 64, 64, 128), "gw2_p64n128": (2, 64, 128, 64, 256), "gw3_p64n64": (3, 64, 64, 64, 128),
    "gw3_p64n128": (3, 64, 128, 64, 256), "gw4_p64n64": (4, 64, 64, 64, 256), "gw4_p64n128": (4, 64, 128, 64, 256),
    "gw3p_p64n128": ("3p", 64, 128, 64, 256), "gw3p_p64n64": ("3p", 64, 64, 64, 128),
    "gw3i_p64n64": ("3i", 64, 64, 64, 128), "gw3i_p64n128": ("3i", 64, 128, 64, 256),
    "gw3i_p64n96": ("3i", 64, 96, 64, 128), "gw3i_p64n96k16": ("3i", 64, 96, 16, 128),
}
REDUCTIONS = {"dx_f16": ("dx", False), "dx_f32": ("dx", True), "dw_f16": ("dw", False), "dw_f32": ("dw", True),
              "dx_taps": ("dx_taps", True)}
FUSED_DX = {"dxn_m16n16k64": (16, 16, 64, 64), "dxn_m64n16k64": (64, 16, 64, 64), "dxn_m16n64k64": (16, 64, 64, 128),
            "dxn_m32n64k64": (32, 64, 64, 128), "dxn_m64n64k64": (64, 64, 64, 128),
            "dxn_m64n128k64": (64, 128, 64, 256)}
FUSED_DW = {"dwn_o64c16k64": (64, 16, 64, 64), "dwn_o64c64k16": (64, 64, 16, 128), "dwn_o64c64k32": (64, 64, 32, 128),
            "dwn_o64c32k64": (64, 32, 64, 128), "dwn_o64c64k64": (64, 64, 64, 128),
            "dwn_o128c64k64": (128, 64, 64, 256)}

FORMS = ("", "_f32", "_bf16")
STAGED_KERNELS = ([("gi", n + s) for n in STAGED_DX for s in FORMS] + [("gw", n + s) for n in STAGED_DW for s in FORMS]
                  + [("csr", n) for n in REDUCTIONS])
FUSED_KERNELS = [(k, n) for k in ("dxn", "dxs") for n in FUSED_DX] + [(k, n) for k in ("dwn", "dws") for n in FUSED_DW]


def test_the_table_holds_exactly_these_presets_one_family_each():
    assert set(_ADJOINT_TABLES) == {f.key for f in R.ADJOINT_FAMILIES}
    assert set(R.ADJOINT_PRESETS) == set(STAGED_DX) | set(STAGED_DW) | set(REDUCTIONS) | set(FUSED_DX) | set(FUSED_DW)
    assert not set(R.ADJOINT_PRESETS) & set(R.PRESETS)
    assert {v for f in R.ADJOINT_FAMILIES for v in f.variants}.isdisjoint({v for f in R.FAMILIES for v in f.variants})


@pytest.mark.parametrize("name", sorted(R.ADJOINT_PRESETS))
def test_every_preset_name_is_the_id_its_parameters_give(name):
    point = R.ADJOINT_PRESETS[name].point
    fam = family(point.family)
    assert fam.format_id(point) == name and point.id == name
    assert fam.parse_id(name) == point and R.lookup_adjoint(name) == point
    assert fam.format_id(point, explicit=True).startswith(name.split("_")[0])
    assert fam.parse_id(fam.format_id(point, explicit=True)) == point
    assert fam.to_row(point) == _ADJOINT_TABLES[fam.key][name]
    assert fam.check(point) == []


@pytest.mark.parametrize("kind, name", STAGED_KERNELS + FUSED_KERNELS)
def test_every_kernel_name_resolves_to_its_tiles_and_back(kind, name):
    point = R.adjoint_point(kind, name)
    fam = point.owner
    assert fam.kernel_key(point) == (kind, name) and kind in fam.kinds
    if kind in ("gi", "gw"):
        base = re.sub(r"_(f32|bf16)$", "", name)
        version, tile_p, cols, step, block_dim = (STAGED_DX if kind == "gi" else STAGED_DW)[base]
        spec = fam.spec(point)
        assert (spec["version"], spec["tile_p"], spec[fam.spec_wide], spec[fam.spec_inner], spec["block_dim"]) == (
            version, tile_p, cols, step, block_dim)
        assert (point["stage"], point["operands"]) == {"": ("fp16", "fp16"), "_f32": ("fp32", "fp16"),
                                                       "_bf16": ("fp32", "bf16")}[name[len(base):]]
        assert point.id == name and fam.from_spec(spec, point["stage"], point["operands"]) == point
    elif kind == "csr":
        target, fp32 = REDUCTIONS[name]
        assert fam.spec(point) == {"target": target, "fp32_stage": fp32, "block_dim": 256}
    else:
        assert fam.tiles(point) == (FUSED_DX if kind.startswith("dx") else FUSED_DW)[name]
        assert point["walk"] == ("segments" if kind.endswith("s") else "whole lists")
        assert point.id == kind + name[3:]                  # the segment kernels' own ids: dxs_..., dws_...


def test_the_kernel_lists_are_the_presets_forms_in_order():
    assert [k for f in ("staged_dx", "staged_dw", "reductions") for k in R.adjoint_kernels(f)] == STAGED_KERNELS
    assert [k for f in ("fused_dx", "fused_dw") for k in R.adjoint_kernels(f)] == FUSED_KERNELS


def test_a_block_other_than_the_usual_one_is_written_in_the_id():
    dx = R.adjoint_point("dxn", "dxn_m64n64k64")
    wide = dx.replace(warps=8)
    assert wide.id == "dxn_m64n64k64b256" and R.adjoint_point("dxn", wide.id) == wide
    gw = R.adjoint_point("gw", "gw4_p64n64_f32")
    assert gw["warps"] == 8 and gw.replace(warps=4).id == "gw4_p64n64b128_f32"
    assert R.adjoint_point("dxs", "dxs_m32n32k32") == R.adjoint_point("dxs", "dxn_m32n32k32")   # points no preset names


def test_names_that_are_no_kernel_say_why():
    with pytest.raises(ValueError, match="kind: expected one of 'gi', 'gw', 'csr'"):
        R.adjoint_point("fw", "x")
    with pytest.raises(KeyError, match="unknown gw config 'gi2_p64b128'; known: .*gw3_p64n128"):
        R.adjoint_point("gw", "gi2_p64b128")
    with pytest.raises(KeyError, match="unknown gi config 'gi2_p64b48': .*tile_b .* must be one of 16, 32"):
        R.adjoint_point("gi", "gi2_p64b48")
    with pytest.raises(KeyError, match="unknown dxn config 'dxn_nope'"):
        R.adjoint_point("dxn", "dxn_nope")
    with pytest.raises(TypeError, match="config: expected a config name"):
        R.adjoint_point("gi", None)
    with pytest.raises(ValueError, match="name: unknown adjoint config 'zz'"):
        R.lookup_adjoint("zz")


def test_a_point_that_cannot_run_says_why():
    gi = R.adjoint_point("gi", "gi3_p64b128")
    assert any("bf16 operands stage in fp32" in r for r in gi.owner.check(gi.replace(operands="bf16")))
    taps = R.adjoint_point("csr", "dx_taps")
    assert any("outputs are fp32" in r for r in taps.owner.check(taps.replace(stage="fp16")))
    gw = R.adjoint_point("gw", "gw3_p64n64")
    assert any("no kernel combines" in r for r in gw.owner.check(gw.replace(grid="nodes x p tiles x tile pairs",
                                                                            prefetch=True)))
    with pytest.raises(ValueError, match="tile_o .* must be one of 64, 96, 128, got 48"):
        gi.replace(tile_o=48)
    # the problem: every adjoint has fp16 and bf16 kernels only, and takes any table layout (the fused ones walk
    # lists of the layer's graph)
    idx, rf = synthetic_graph(40, 24, 9, 11, 0.2, seed=3)
    meta = build_meta(idx, rf, cin=8, cout=40, v=11, nin=40)
    flat = Problem(batch=8, cin=8, nin=40, cout=40, nout=24, p64=128, q=88, node_major=False)
    dx = R.adjoint_point("dxs", "dxn_m16n16k64")
    assert dx.owner.check(dx, Problem.of(meta, 8)) == [] and dx.owner.check(dx, flat) == []
    assert gi.owner.check(gi, flat) == [] and gi.owner.check(gi, Problem.of(meta, 8, dtype=torch.bfloat16)) == []
    for point in (gi, dx, taps):
        fp32 = point.owner.check(point, Problem.of(meta, 8, dtype=torch.float32))
        assert any("fp16 or bf16 only, not float32" in r for r in fp32), point
    # the device: shared memory over what a block may hold
    small = DEVICES["h200"].__class__("a GPU of 32 KiB blocks", 80, sms=8, smem_per_block=32 * 1024)
    big = R.adjoint_point("gi", "gi2_p64b256")
    assert any("KiB of shared memory, over the 32 KiB" in r for r in big.owner.check(big, device=small))
    assert big.owner.check(big, device=DEVICES["h200"]) == []


def test_every_kernel_reads_in_words_and_has_a_roofline():
    config_id = re.compile(r"\b(gi|gw|dx|dw)\w*_[a-z]?\d|\bm\d+n\d+|\bp\d+[bn]\d+")
    names = [describe(n) for n in R.ADJOINT_PRESETS]
    assert len(set(names)) == len(names) and not [n for n in names if config_id.search(n)]
    assert describe("dxs_m64n64k64") == ("fused dx, 64 batch rows x 64 input channels per tile, 64 output channels "
                                         "per step, 4 warps per block, balanced segments of the reverse lists")
    assert describe("gw3i_p64n96k16_bf16").endswith("x's rows staged by a row copy, fp32 stage, bf16 operands")
    assert family("fused_dx").tile_words(R.adjoint_point("dxn", "dxn_m64n16k64")) == (
        "64 batch rows x 16 input channels per tile, 64 output channels per step")
    idx, rf = synthetic_graph(40, 24, 9, 11, 0.2, seed=3)
    problem = Problem.of(build_meta(idx, rf, cin=64, cout=64, v=11, nin=40), 64)
    for kind, name in STAGED_KERNELS + FUSED_KERNELS:
        point = R.adjoint_point(kind, name)
        est = point.owner.estimate(point, problem, DEVICES["h200"])
        assert est.ms is not None and est.ms > 0 and est.flops > 0 and est.nbytes > 0, (kind, name)
    assert R.adjoint_point("dxn", "dxn_m16n16k64").owner.estimate(
        R.adjoint_point("dxn", "dxn_m16n16k64"), problem, DEVICES["cpu"]).ms is None


def test_the_configs_command_lists_the_adjoint_families_in_words(capsys):
    from fovi_lab.cli import main
    from fovi_lab.kernels.families.listing import ADJOINT_INTRO, listing
    text = listing()
    assert ADJOINT_INTRO in text and text.index("tensor cores  (tensor_cores;") < text.index(ADJOINT_INTRO)
    for name, preset in R.ADJOINT_PRESETS.items():
        assert f"    {name:22s} {describe(name)}" in text
    assert "fused dx  (fused_dx; kinds dxn, dxs; kernel factory in fovi_lab.kernels.adjoint.fused)" in text
    assert "  walk          walk: whole lists, segments" in text
    assert main(["configs", "--family", "staged_dw"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(ADJOINT_INTRO) and "gw3i_p64n96k16         staged dW, 64 table entries x 96 output " in out
    assert "with bf16 operands (`<name>_bf16`" in out and "tensor cores" not in out
    assert main(["configs", "--family", "pipelined"]) == 0
    assert ADJOINT_INTRO not in capsys.readouterr().out


def test_docs_kernels_md_has_the_adjoint_families():
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[3] / "docs" / "kernels.md").read_text()
    adjoint = doc[doc.index("# The adjoint kernel families"):]
    for fam in R.ADJOINT_FAMILIES:
        assert f"## {fam.title} (`{fam.key}`)" in adjoint
    for name in R.ADJOINT_PRESETS:
        assert f"| `{name}` | {describe(name)} |" in adjoint


def test_explain_says_which_adjoint_families_run_the_gradients_and_why_the_others_cannot():
    import fovi_lab
    from fovi_lab.kernels.adjoint.rule import adjoint_plan
    idx, rf = synthetic_graph(40, 24, 9, 11, 0.2, seed=3)
    meta = build_meta(idx, rf, cin=32, cout=40, v=11, nin=40)
    ex = fovi_lab.explain(meta, 8, device="h200")
    verdicts = {v.family: v for v in ex.adjoints}
    assert list(verdicts) == [f.key for f in R.ADJOINT_FAMILIES]
    plan = adjoint_plan(meta, 8, torch.float16, device="cuda")
    assert (plan.dx, plan.dw) == ("fused", "fused")
    dx, dw = plan.fused
    assert verdicts["fused_dx"].status == f"runs dx: {describe(dx.point)}  [{dx.point.id}]"
    assert verdicts["fused_dw"].status.startswith("runs dW: fused dW")
    assert verdicts["staged_dx"].status == "can run" and verdicts["staged_dx"].runnable == len(STAGED_DX)
    text = str(ex)
    assert "adjoint families:\n  staged dx: can run (16 registered points can; roofline at least" in text
    # a device whose blocks hold 4 KiB of shared memory: no tile of any adjoint fits, and the sums need none
    tiny = DEVICES["h200"].__class__("a GPU of 4 KiB blocks", 80, sms=8, smem_per_block=4 * 1024)
    verdicts = {v.family: v for v in fovi_lab.explain(meta, 8, device=tiny).adjoints}
    assert verdicts["fused_dx"].status == "cannot run" and "over the 4 KiB" in verdicts["fused_dx"].reasons[0]
    assert verdicts["fused_dx"].reasons[-1].startswith("the plan's path for dx: where it cannot launch")
    for key in ("staged_dx", "staged_dw"):                           # not the plan's path: their own reasons only
        assert verdicts[key].status == "cannot run"
        assert all("a block may hold on a GPU of 4 KiB blocks" in r for r in verdicts[key].reasons)
    assert verdicts["reductions"].status == "can run"

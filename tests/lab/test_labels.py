"""Kernel configs in words (fovi_lab.lab.labels): every preset, derived id, stage config and fused adjoint config reads
as words, long (kernel_label) and compact (short_label, for a table column), and the config-id pattern the notebook
checks use knows every name a figure or a printed table could show."""

import pytest

from fovi_lab.kernels.adjoint import GRAD_INPUT_CONFIG_SPECS, GRAD_WEIGHT_CONFIG_SPECS
from fovi_lab.kernels.adjoint.fused import DW_NM_CONFIG_SPECS, DX_NM_CONFIG_SPECS
from fovi_lab.kernels.families import registry
from fovi_lab.lab.labels import CONFIG_ID, kernel_label, short_label, stage_label, tick_label

NAMES = sorted(n for n, p in registry.PRESETS.items() if p.point is not None)
STAGES = sorted(GRAD_INPUT_CONFIG_SPECS) + sorted(GRAD_WEIGHT_CONFIG_SPECS)
FUSED = sorted(DX_NM_CONFIG_SPECS) + sorted(DW_NM_CONFIG_SPECS)


def test_the_id_pattern_knows_every_preset_derived_id_and_stage_config():
    derived = [registry.family(registry.lookup(n).family).format_id(registry.lookup(n)) for n in NAMES]
    names = NAMES + derived + STAGES + [s + "_f32" for s in STAGES] + FUSED
    assert [n for n in names if not CONFIG_ID.fullmatch(n)] == []
    assert not CONFIG_ID.search("64 rows x 128 channels per tile, r = 2, tensor cores, cp.async pipeline")


@pytest.mark.parametrize("name", NAMES + STAGES + FUSED)
def test_every_config_reads_as_words(name):
    words = kernel_label(name)
    assert words != name and not CONFIG_ID.search(words), words
    assert tick_label(name) == words.replace(", ", "<br>")
    short = short_label(name)
    assert short != name and not CONFIG_ID.search(short) and not CONFIG_ID.search(short_label(name, title=False)), short
    assert len(short) <= 64 and len(short) < len(words), short     # fits a table column


def test_short_labels_tell_every_kernel_apart():
    """Two configs share a compact label only where they are one kernel (a preset and its alias)."""
    by_label = {}
    for n in NAMES:
        by_label.setdefault(short_label(n), set()).add(registry.lookup(n))
    assert [label for label, points in by_label.items() if len(points) > 1] == []
    stages = STAGES + [s + "_f32" for s in STAGES]
    assert len({short_label(s) for s in stages}) == len(stages) and len({short_label(f) for f in FUSED}) == len(FUSED)


def test_labels_say_what_the_parameters_are():
    assert kernel_label("m32n64r2") == ("tile GEMM over gathered rows, 32 rows x 64 channels per tile, 2 batch tiles "
                                        "share each weight tile")
    assert kernel_label("m32n64r2", title=False).startswith("32 rows x 64 channels per tile")
    assert kernel_label("gi3i_p64b128o96") == stage_label("gi3i_p64b128o96") == (
        "dx stage, 64 p x 128 batch tile, 96 channels per step, blocks over node, p tile and batch tile, operands "
        "staged by a row copy, fp16 stage")
    assert kernel_label("gw2_p64n64_f32").endswith("fp32 stage")
    assert kernel_label("not_a_config") == "not_a_config" and stage_label("mma_o32b8") is None
    assert short_label("not_a_config") == "not_a_config"


def test_short_labels_say_the_tile_and_what_differs():
    assert short_label("mmato_o64b32b256") == "tensor cores 64x32, 8 warps, x^T, staged store"
    assert short_label("mmap_o64b128k32s3") == "pipelined tensor cores 64x128, 32 p/stage, 3 stages"
    assert short_label("mmap_o64b128k32s3", title=False) == "64x128, 32 p/stage, 3 stages"
    assert short_label("m32n64r2") == "gather tiles 32x64, r = 2"
    assert short_label("nms_m16n32k64") == "node-major 16x32, 64 ch/step, 2 warps, split"
    assert short_label("ss_b4o8u4") == "SIMT 4x8, 4 p/step, split"
    assert short_label("gi3_p64b128_f32") == "dx 64 p x 128 rows, gi3 grid, fp32 stage"
    assert short_label("dwn_o64c64k16") == "fused dW 64x64, 16-deep" and short_label("dxn_m16n16k64", title=False) == "16x16, 64-deep"
    assert kernel_label("dxn_m64n16k64") == ("fused dx, 64 batch rows x 16 input channels per tile, 64 output channels "
                                             "per step")


def test_a_gradients_path_reads_in_words():
    import torch

    from fovi_lab.kernels.adjoint.rule import adjoint_plan
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.lab.labels import PATH_WORDS, path_words

    assert [path_words(p) for p in ("mma", "fused", "staged")] == ["tensor cores", "fused kernels", "staged kernels"]
    assert path_words("other") == "other"
    plan = adjoint_plan(layer_meta("dinov3_patch"), 512, torch.float16)      # every path the plan can name has words
    assert {plan.dx, plan.dw} <= set(PATH_WORDS)

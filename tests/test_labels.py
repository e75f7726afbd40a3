"""Kernel configs in words (fovi_lab.lab.labels): every preset, derived id and stage config reads as words, and the
config-id pattern the notebook checks use knows every name a figure could show."""

import pytest

from fovi_lab.kernels.adjoint import GRAD_INPUT_CONFIG_SPECS, GRAD_WEIGHT_CONFIG_SPECS
from fovi_lab.kernels.families import registry
from fovi_lab.lab.labels import CONFIG_ID, kernel_label, stage_label, tick_label

NAMES = sorted(n for n, p in registry.PRESETS.items() if p.point is not None)
STAGES = sorted(GRAD_INPUT_CONFIG_SPECS) + sorted(GRAD_WEIGHT_CONFIG_SPECS)


def test_the_id_pattern_knows_every_preset_derived_id_and_stage_config():
    derived = [registry.family(registry.lookup(n).family).format_id(registry.lookup(n)) for n in NAMES]
    names = NAMES + derived + STAGES + [s + "_f32" for s in STAGES]
    assert [n for n in names if not CONFIG_ID.fullmatch(n)] == []
    assert not CONFIG_ID.search("64 rows x 128 channels per tile, r = 2, tensor cores, cp.async pipeline")


@pytest.mark.parametrize("name", NAMES + STAGES)
def test_every_config_reads_as_words(name):
    words = kernel_label(name)
    assert not CONFIG_ID.search(words), words
    assert tick_label(name) == words.replace(", ", "<br>")


def test_labels_say_what_the_parameters_are():
    assert kernel_label("m32n64r2") == ("tile GEMM over gathered rows, 32 rows x 64 channels per tile, 2 batch tiles "
                                        "share each weight tile")
    assert kernel_label("m32n64r2", title=False).startswith("32 rows x 64 channels per tile")
    assert kernel_label("gi3i_p64b128o96") == stage_label("gi3i_p64b128o96") == (
        "dx stage, 64 p x 128 batch tile, 96 channels per step, blocks over node, p tile and batch tile, operands "
        "staged by a row copy, fp16 stage")
    assert kernel_label("gw2_p64n64_f32").endswith("fp32 stage")
    assert kernel_label("not_a_config") == "not_a_config" and stage_label("mma_o32b8") is None

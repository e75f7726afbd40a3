"""Forward kernel families as objects: typed parameters, readable names, checks that say why a point cannot
run, roofline estimates, and one registry (:mod:`fovi_lab.kernels.families.registry`)."""

from fovi_lab.kernels.families.base import DeviceSpec, Estimate, Family, Param, Point, Preset, Problem
from fovi_lab.kernels.families.registry import (DEVICES, FAMILIES, PRESETS, aliases, config_of, describe,
                                                device_spec, family, lookup, preset_name, presets)

__all__ = ["DeviceSpec", "Estimate", "Family", "Param", "Point", "Preset", "Problem", "DEVICES", "FAMILIES",
           "PRESETS", "aliases", "config_of", "describe", "device_spec", "family", "lookup", "preset_name", "presets"]

"""What the package knows of devices: limits and datasheet peaks (:class:`DeviceSpec`, :data:`DEVICES`), the
current device's spec (:func:`device_spec`), and the architecture of a recorded device name
(:func:`arch_of_name`: the ``auto`` backend reads the records of a GPU of the same architecture where a device
has none of its own). The kernel families' checks and roofline estimates read these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Union

import torch


@dataclass(frozen=True)
class DeviceSpec:
    """A device's limits and (datasheet) peaks.

    ``arch``: compute capability as ``major * 10 + minor`` (90 for sm_90), None for the CPU.
    ``smem_per_block``: the shared memory one block may opt into, in bytes. Peaks are datasheet figures (dense
    fp16 tensor-core TFLOP/s with fp32 accumulation, fp32 CUDA-core TFLOP/s, HBM TB/s); None where unknown:
    :meth:`Family.estimate` then says it has no roofline for this device."""

    name: str
    arch: Optional[int]
    sms: int = 0
    smem_per_block: int = 0
    tensor_tflops: Optional[float] = None
    fp32_tflops: Optional[float] = None
    hbm_tbps: Optional[float] = None
    source: str = "datasheet"

    @property
    def is_cpu(self) -> bool:
        return self.arch is None

    def words(self) -> str:
        if self.is_cpu:
            return "the CPU (Warp's CPU device)"
        peaks = (f"{self.tensor_tflops:g} TFLOP/s fp16 tensor, {self.fp32_tflops:g} TFLOP/s fp32, "
                 f"{self.hbm_tbps:g} TB/s ({self.source})" if self.tensor_tflops else "no peak figures known")
        return f"{self.name} (sm_{self.arch}, {self.sms} SMs; {peaks})"


#: Datasheet figures (SXM forms): dense fp16 tensor-core TFLOP/s with fp32 accumulation, fp32 TFLOP/s, HBM TB/s;
#: the shared memory one block may opt into.
DEVICES: Dict[str, DeviceSpec] = {
    "h200": DeviceSpec("NVIDIA H200", 90, sms=132, smem_per_block=227 * 1024, tensor_tflops=989.4,
                       fp32_tflops=66.9, hbm_tbps=4.8),
    "h100": DeviceSpec("NVIDIA H100 80GB HBM3", 90, sms=132, smem_per_block=227 * 1024, tensor_tflops=989.4,
                       fp32_tflops=66.9, hbm_tbps=3.35),
    "a100": DeviceSpec("NVIDIA A100-SXM4-80GB", 80, sms=108, smem_per_block=163 * 1024, tensor_tflops=312.0,
                       fp32_tflops=19.5, hbm_tbps=2.039),
    "cpu": DeviceSpec("cpu", None, smem_per_block=256 * 1024, source="Warp's CPU tile arena"),
}


def device_spec(device: Union[None, str, torch.device, DeviceSpec] = None) -> DeviceSpec:
    """The spec of ``device``: a key of :data:`DEVICES` (``"h200"``), ``"cpu"``, a CUDA device (read from the
    driver: its name, compute capability, SMs and shared memory; the peaks from :data:`DEVICES` where the name
    is one of its models, else none), or None (CUDA's current device where there is one, else the CPU)."""
    if isinstance(device, DeviceSpec):
        return device
    if isinstance(device, str) and device.lower() in DEVICES:
        return DEVICES[device.lower()]
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    models = ", ".join(k for k in DEVICES if k != "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected cpu, cuda[:i] or one of {models}, got {device!r}") from None
    if dev.type == "cpu":
        return DEVICES["cpu"]
    if dev.type != "cuda":
        raise ValueError(f"device: expected cpu, cuda[:i] or one of {models}, got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} asks for a CUDA GPU and this machine has none; name a GPU model "
                         f"({models}) to use its datasheet figures, or cpu")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device: {device!r} names GPU {dev.index}, and this machine has "
                         f"{torch.cuda.device_count()} (cuda:0 to cuda:{torch.cuda.device_count() - 1}); or name a "
                         f"GPU model ({models})")
    props = torch.cuda.get_device_properties(dev)
    # datasheet peaks only for the exact model (an H100 PCIe shares the SXM's name stem, not its peaks)
    known = next((s for s in DEVICES.values() if s.arch is not None and s.name == props.name), None)
    smem = int(getattr(props, "shared_memory_per_block_optin", 0) or 0)
    return DeviceSpec(props.name, props.major * 10 + props.minor, sms=props.multi_processor_count,
                      smem_per_block=smem or (known.smem_per_block if known else 48 * 1024),
                      tensor_tflops=known.tensor_tflops if known else None,
                      fp32_tflops=known.fp32_tflops if known else None,
                      hbm_tbps=known.hbm_tbps if known else None,
                      source=f"datasheet of the {known.name}" if known else "no datasheet figures known")



def arch_of_name(name: Optional[str]) -> Optional[int]:
    """The compute capability (``major * 10 + minor``) of a recorded device name, where :data:`DEVICES` knows the
    model, else None."""
    if not name:
        return None
    for spec in DEVICES.values():
        if spec.arch is not None and spec.name.split()[1] in name:
            return spec.arch
    return None


__all__ = ["DeviceSpec", "DEVICES", "device_spec", "arch_of_name"]

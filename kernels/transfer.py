"""Host↔device transfer bandwidth (pinned and pageable host memory), which bounds partial
offload: every layer kept on the CPU moves its activations, and streaming weights moves them.

Pinned copies are DMA straight from page-locked memory and run near the PCIe link's speed;
pageable copies go through a staging buffer in the driver and are typically slower. On NVIDIA
cards the link the GPU trained to right now is read from NVML beside the copy, so a card that
runs at x4 in an x16 slot shows up (see anomalies.py).
"""

from __future__ import annotations

from typing import Any

from hearthside.core.units import MIB
from hearthside.kernels.measurement import Measurement, Samples, measure_until_stable
from hearthside.kernels.torch_support import (
    TorchDevice,
    calls_per_sample,
    first_line,
    release_memory,
    seconds_per_call,
)

TRANSFER_BYTES = 256 * MIB
QUICK_TRANSFER_BYTES = 64 * MIB
DIRECTIONS = ("h2d", "d2h")


def measure_transfer(
    torch: Any,
    device: TorchDevice,
    direction: str,
    *,
    pinned: bool,
    nbytes: int,
    budget_s: float,
    warmup_s: float,
) -> Measurement:
    """GB/s of one `direction` ("h2d" or "d2h") copy of `nbytes` between host and `device`."""
    memory = "pinned" if pinned else "pageable"
    params: dict[str, Any] = {"pinned": pinned, "bytes": nbytes, "gpu": device.name}
    method = f"torch copy_ of {nbytes // MIB} MiB, {memory} host memory, {direction}"
    try:
        samples = _time_transfer(
            torch, device, direction, pinned, nbytes, budget_s=budget_s, warmup_s=warmup_s
        )
    except Exception as error:  # pinning unsupported (MPS), out of memory
        note = f"{memory} {direction} did not run on {device.label}: {first_line(error)}"
        return Measurement.failed(
            direction, device.label, "GB/s", note, method=method, params=params
        )
    finally:
        release_memory(torch, device)
    params.update(pcie_link(device))
    return Measurement.from_samples(
        direction, device.label, "GB/s", samples, method=method, params=params
    )


def _time_transfer(
    torch: Any,
    device: TorchDevice,
    direction: str,
    pinned: bool,
    nbytes: int,
    *,
    budget_s: float,
    warmup_s: float,
) -> Samples:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    host.fill_(1)  # fault the pages in before timing
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=device.torch_device)
    if direction == "h2d":

        def copy() -> None:
            on_device.copy_(host, non_blocking=pinned)

    else:

        def copy() -> None:
            host.copy_(on_device, non_blocking=pinned)

    calls = calls_per_sample(torch, device, copy)
    return measure_until_stable(
        lambda: nbytes / seconds_per_call(torch, device, copy, calls) / 1e9,
        budget_s=budget_s,
        warmup_s=warmup_s,
    )


def pcie_link(device: TorchDevice) -> dict[str, int]:
    """The GPU's PCIe link now and at most, from NVML (NVIDIA only); empty when unknown."""
    if device.backend != "cuda" or not device.uuid:
        return {}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        handle = _nvml_handle(pynvml, device.uuid)
        readings = {
            "pcie_generation_now": pynvml.nvmlDeviceGetCurrPcieLinkGeneration,
            "pcie_width_now": pynvml.nvmlDeviceGetCurrPcieLinkWidth,
            "pcie_generation_max": pynvml.nvmlDeviceGetMaxPcieLinkGeneration,
            "pcie_width_max": pynvml.nvmlDeviceGetMaxPcieLinkWidth,
        }
        return {name: int(read(handle)) for name, read in readings.items()}
    except Exception:  # a GPU on NVLink-C2C or a driver without these queries
        return {}
    finally:
        pynvml.nvmlShutdown()


def _nvml_handle(pynvml: Any, uuid: str) -> Any:
    """NVML names devices "GPU-<uuid>"; torch prints the bare UUID."""
    text = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    return pynvml.nvmlDeviceGetHandleByUUID(text)

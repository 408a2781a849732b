"""What llama.cpp really allocated for a load, read from the lines it logs while loading.

The loader reports each buffer it makes: weights ("CPU_Mapped model buffer size = 235.16
MiB"), the KV cache per device and per cache (a sliding-window model has two), the output
buffer and the scheduler's compute buffer. These are the figures the memory model is checked
against, and what the plan view shows as "measured".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from hearthside.core.units import MIB

# A line's text comes from the model file too (llama.cpp logs `general.name` whole), so every
# pattern here is anchored at the start of the line and each repetition is bounded: a match
# costs the same on a 16 MiB line as on a normal one (issue 36).
# "load_tensors:   CPU_Mapped model buffer size =   235.16 MiB"
_BUFFER = re.compile(
    r"[ \t]{0,16}[A-Za-z0-9_]{1,64}:[ \t]{1,64}(?P<buffer>[A-Za-z0-9_]{1,64})[ \t]{1,64}"
    r"(?P<kind>model|KV|compute|output) buffer size[ \t]{0,64}=[ \t]{0,64}"
    r"(?P<mib>[0-9]{1,15}(?:\.[0-9]{1,6})?) MiB"
)
# "llama_kv_cache: size = 7.97 MiB ( 1024 cells, 15 layers, 1/1 seqs), K (q8_0): 3.98 MiB, ..."
_KV_CACHE = re.compile(
    r"[ \t]{0,16}llama_kv_cache: size =[ \t]{0,64}(?P<mib>[0-9]{1,15}(?:\.[0-9]{1,6})?) MiB "
    r"\([ \t]{0,64}(?P<cells>[0-9]{1,12}) cells,[ \t]{0,64}(?P<layers>[0-9]{1,6}) layers"
    r"[^()]{0,64}\),[ \t]{0,64}K \((?P<type_k>\w{1,32})\):[ \t]{0,64}"
    r"(?P<k_mib>[0-9]{1,15}(?:\.[0-9]{1,6})?) MiB, V \((?P<type_v>\w{1,32})\):[ \t]{0,64}"
    r"(?P<v_mib>[0-9]{1,15}(?:\.[0-9]{1,6})?) MiB"
)
# "tensor blk.0.ffn_down.weight (1 MiB q6_K) buffer type overridden to CPU" (llama.cpp's tensor
# names are under 64 bytes, GGML_MAX_NAME).
_OVERRIDDEN = re.compile(
    r"[ \t]{0,16}tensor (?P<name>\S{1,256}) \([^()]{0,64}\) buffer type overridden to "
    r"(?P<buffer>\S{1,64})"
)

# Buffers in host memory, whatever their name: mmapped weights, repacked weights, pinned staging.
_HOST_BUFFER = re.compile(r"CPU(?:_\S{0,64})?|\S{0,64}_Host")


def device_of(buffer: str) -> str:
    """The memory a buffer occupies: "CPU" for every host buffer, else the device ("CUDA0")."""
    return "CPU" if _HOST_BUFFER.fullmatch(buffer) else buffer


@dataclass
class DeviceMemory:
    """Bytes llama.cpp allocated on one device, by purpose."""

    device: str
    model_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0
    output_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes


@dataclass(frozen=True)
class KvCacheReport:
    """One KV cache (a sliding-window model has a full-context one and a windowed one)."""

    cells: int
    layers: int
    type_k: str
    type_v: str
    bytes: int


@dataclass
class LoadReport:
    devices: dict[str, DeviceMemory] = field(default_factory=dict)
    kv_caches: list[KvCacheReport] = field(default_factory=list)
    overridden: dict[str, str] = field(default_factory=dict)  # tensor name -> buffer

    def device(self, name: str) -> DeviceMemory:
        return self.devices.setdefault(name, DeviceMemory(name))

    @property
    def model_bytes(self) -> int:
        return sum(memory.model_bytes for memory in self.devices.values())

    @property
    def kv_bytes(self) -> int:
        return sum(memory.kv_bytes for memory in self.devices.values())

    @property
    def compute_bytes(self) -> int:
        return sum(memory.compute_bytes for memory in self.devices.values())

    @property
    def total_bytes(self) -> int:
        return sum(memory.total_bytes for memory in self.devices.values())

    def to_dict(self) -> dict[str, object]:
        return {
            "devices": {
                name: {
                    "model_bytes": memory.model_bytes,
                    "kv_bytes": memory.kv_bytes,
                    "compute_bytes": memory.compute_bytes,
                    "output_bytes": memory.output_bytes,
                }
                for name, memory in self.devices.items()
            },
            "kv_caches": [vars(cache) for cache in self.kv_caches],
            "overridden": dict(self.overridden),
        }


def parse_load_log(lines: Iterable[str]) -> LoadReport:
    """The buffers a load's log lines report, summed per device."""
    report = LoadReport()
    for line in lines:
        _read_line(report, line)
    return report


def _read_line(report: LoadReport, line: str) -> None:
    if match := _KV_CACHE.match(line):
        report.kv_caches.append(
            KvCacheReport(
                cells=int(match["cells"]),
                layers=int(match["layers"]),
                type_k=match["type_k"],
                type_v=match["type_v"],
                bytes=_bytes(match["mib"]),
            )
        )
    elif match := _BUFFER.match(line):
        memory = report.device(device_of(match["buffer"]))
        attribute = f"{match['kind'].lower()}_bytes"
        setattr(memory, attribute, getattr(memory, attribute) + _bytes(match["mib"]))
    elif match := _OVERRIDDEN.match(line):
        report.overridden[match["name"]] = match["buffer"]


def _bytes(mib: str) -> int:
    return round(float(mib) * MIB)

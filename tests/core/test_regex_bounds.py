"""No regular expression over text from a model file, the engine's log or a request can hang.

llama.cpp logs a model's `general.name` whole, so a 16 MiB name is a 16 MiB log line, and a
pattern that backtracks quadratically over it hangs every load (issue 36: the old `_BUFFER`
took 69 s on 64 K letters). Each pattern below is imported from its module and fed adversarial
lines: long runs of one character, its own sample line's prefixes repeated, and each prefix
followed by a long run. Every try must stay within a linear budget, 100 ms for 1 MB.

The sizes grow (16 KiB, 128 KiB, 1 MiB) so that a quadratic pattern fails in seconds at a
small size instead of running for hours on the big one.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from hearthside.app import cli_support
from hearthside.autotune import memory as autotune_memory
from hearthside.core.engine import load_report, remote, template_limits
from hearthside.core.models import child_check, download, gguf_validator, hub_http, quantize, spec
from hearthside.core.server import schema_converter, schemas, structured
from hearthside.kernels import engine_run

SIZES = (16 * 1024, 128 * 1024, 1024 * 1024)
BUDGET_S_PER_MIB = 0.100
BUDGET_FLOOR_S = 0.005  # timer and scheduler noise on a tiny input
TRIES = 3  # the best of three, in CPU time: other processes share this machine's cores
MATCHES_TAKEN = 1000  # finditer/sub: the first matches (a million match objects cost anyway)

RUN_CHARACTERS = 'aA0 _.-()%["\\\t:/'
RUN_PAIRS = ("a ", "a1", "%(", "[ ", "\\a", "a.", "a:", "(a")
AFTER_PREFIX = "a0 .(\\"
MAX_PREFIXES = 12


@dataclass(frozen=True)
class Use:
    """A pattern and the way its module applies it, with a real line it is meant for."""

    name: str
    pattern: re.Pattern[str]
    how: str  # "match", "search", "fullmatch", "finditer" or "sub"
    sample: str


USES = [
    # llama.cpp's log while loading (core/engine/load_report.py)
    Use(
        "load_report._BUFFER",
        load_report._BUFFER,
        "match",
        "load_tensors:   CPU_Mapped model buffer size =   235.16 MiB",
    ),
    Use(
        "load_report._KV_CACHE",
        load_report._KV_CACHE,
        "match",
        "llama_kv_cache: size = 1024.00 MiB (  8192 cells,  32 layers,  1/1 seqs), "
        "K (f16):  512.00 MiB, V (f16):  512.00 MiB",
    ),
    Use(
        "load_report._OVERRIDDEN",
        load_report._OVERRIDDEN,
        "match",
        "tensor blk.0.ffn_down.weight (1 MiB q6_K) buffer type overridden to CPU",
    ),
    Use("load_report._HOST_BUFFER", load_report._HOST_BUFFER, "fullmatch", "CPU_Mapped_Host"),
    # the first load's child: llama.cpp's stderr (core/models/child_check.py)
    Use(
        "child_check._ABORT",
        child_check._ABORT,
        "match",
        "/src/ggml/src/ggml.c:1234: GGML_ASSERT(ggml_nelements(a) == ne0) failed",
    ),
    Use(
        "child_check._LOAD_ERROR",
        child_check._LOAD_ERROR,
        "search",
        "llama_model_load: error loading model: check_tensor_dims: tensor 'output' not found",
    ),
    Use(
        "child_check._EXCEPTION_LINE",
        child_check._EXCEPTION_LINE,
        "match",
        "llama_cpp.LlamaError: Failed to load model from file",
    ),
    # llama.cpp's quantizer log, with the file's tensor names (core/models/quantize.py)
    Use(
        "quantize._TENSOR_LINE",
        quantize._TENSOR_LINE,
        "match",
        "[  12/ 236]   blk.1.attn_q.weight - [  640,   640,     1,     1], type =    f16, ",
    ),
    # tensor names from the file
    Use(
        "gguf_validator._LAYER_TENSOR",
        gguf_validator._LAYER_TENSOR,
        "match",
        "blk.12.attn_q.weight",
    ),
    Use(
        "gguf_validator._ATTENTION_TENSOR",
        gguf_validator._ATTENTION_TENSOR,
        "match",
        "blk.12.attn_qkv.weight",
    ),
    Use("spec._BLOCK_TENSOR", spec._BLOCK_TENSOR, "fullmatch", "blk.12.ffn_down.weight"),
    Use("autotune.memory._BLOCK", autotune_memory._BLOCK, "match", "blk.12.ffn_down.weight"),
    Use("engine_run._BLOCK", engine_run._BLOCK, "match", "blk.12.ffn_down.weight"),
    # chat templates from the file (core/engine/template_limits.py)
    Use(
        "template_limits._PRINTF_FIELD",
        template_limits._PRINTF_FIELD,
        "finditer",
        "%(role)-10.3s: %(content)s %d%% %*.*f",
    ),
    Use("template_limits._DIGITS", template_limits._DIGITS, "finditer", ">10.3f"),
    # metadata printed on a terminal (app/cli_support.py)
    Use("cli_support._UNPRINTABLE", cli_support._UNPRINTABLE, "sub", "Evil\x1b[2J\u202e name"),
    # requests to the API server and what the model writes for them
    Use(
        "structured.HEAD_RE",
        structured.HEAD_RE,
        "match",
        '  {"name": "get_weather", "arguments": {"city": "Paris"}}',
    ),
    Use("structured.TOOL_NAME_RE", structured.TOOL_NAME_RE, "fullmatch", "get_weather"),
    Use("schemas.LONE_SURROGATE", schemas.LONE_SURROGATE, "search", "text \ud800 more"),
    Use("schema_converter._UUID_FORMAT", schema_converter._UUID_FORMAT, "match", "uuid4"),
    # replies from remote servers and the model hub
    Use("remote._BEARER", remote._BEARER, "sub", "token rejected: Bearer sk-abc123 (401)"),
    Use("remote._CONTROL", remote._CONTROL, "sub", "bad\x1b[2J\x00request"),
    Use("download._CONTENT_RANGE", download._CONTENT_RANGE, "fullmatch", "bytes 0-1023/4096"),
    Use("hub_http._SHA256_PATTERN", hub_http._SHA256_PATTERN, "fullmatch", "ab12" * 16),
    *(
        Use(f"hub_http._HUB_CDN_HOST_PATTERNS[{index}]", pattern, "fullmatch", host)
        for index, (pattern, host) in enumerate(
            zip(
                hub_http._HUB_CDN_HOST_PATTERNS,
                ("cdn-lfs-us-1.hf.co", "cas-bridge.xethub.hf.co"),
                strict=True,
            )
        )
    ),
]


def apply(use: Use, text: str) -> None:
    if use.how == "finditer":
        for _ in itertools.islice(use.pattern.finditer(text), MATCHES_TAKEN):
            pass
    elif use.how == "sub":
        use.pattern.sub("", text, count=MATCHES_TAKEN)
    else:
        getattr(use.pattern, use.how)(text)


def prefixes(sample: str) -> list[str]:
    """The sample cut after each separator (and whole, less its last character)."""
    cuts = [index + 1 for index, char in enumerate(sample) if not char.isalnum()]
    found = list(dict.fromkeys(sample[:cut] for cut in [*cuts, len(sample) - 1] if cut > 0))
    step = max(1, len(found) // MAX_PREFIXES)
    return found[::step]


def adversarial_lines(sample: str) -> Iterator[tuple[str, str]]:
    """(head, unit): the line is `head` then `unit` repeated to the size wanted."""
    for unit in [*RUN_CHARACTERS, *RUN_PAIRS]:
        yield "", unit
    for prefix in prefixes(sample):
        yield "", prefix
        for unit in AFTER_PREFIX:
            yield prefix, unit


def line_of(head: str, unit: str, size: int) -> str:
    return (head + unit * ((size - len(head)) // len(unit) + 1))[:size]


def best_time_s(run: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(TRIES):
        started = time.thread_time()
        run()
        best = min(best, time.thread_time() - started)
        if best <= BUDGET_FLOOR_S:
            break
    return best


def budget_s(size: int) -> float:
    return max(BUDGET_S_PER_MIB * size / (1024 * 1024), BUDGET_FLOOR_S)


def slowest_line(use: Use) -> tuple[float, int, str] | None:
    """The first (seconds, size, line start) over budget, or None when every line is fast."""
    for size in SIZES:
        for head, unit in adversarial_lines(use.sample):
            text = line_of(head, unit, size)
            first = time.thread_time()
            apply(use, text)
            if time.thread_time() - first <= budget_s(size):
                continue
            took = best_time_s(lambda text=text: apply(use, text))
            if took > budget_s(size):
                return took, size, text[:60]
    return None


def test_each_sample_is_a_line_its_pattern_is_for() -> None:
    for use in USES:
        if use.how == "finditer":
            assert next(use.pattern.finditer(use.sample), None) is not None, use.name
        elif use.how == "sub":
            assert use.pattern.subn("", use.sample)[1] > 0, use.name
        else:
            assert getattr(use.pattern, use.how)(use.sample) is not None, use.name


@pytest.mark.parametrize("use", USES, ids=[use.name for use in USES])
def test_a_pattern_is_linear_on_a_megabyte_of_adversarial_text(use: Use) -> None:
    slow = slowest_line(use)
    assert slow is None, (
        f"{use.name}.{use.how} took {slow[0] * 1000:.0f} ms on {slow[1]} characters "
        f"starting {slow[2]!r} (budget {budget_s(slow[1]) * 1000:.0f} ms)"
    )


ASSERTION = "GGML_ASSERT(ggml_nelements(a) == ne0) failed"
ASSERT_LINE = f"/src/ggml/src/ggml.c:1234: {ASSERTION}"


@pytest.mark.parametrize(
    "log_tail",
    [
        "GGML_ASSERT(" * (1024 * 1024 // 12),
        "GGML_ASSERT(x" + ") failed(" * (1024 * 1024 // 9),
        "error loading model: " * (1024 * 1024 // 21),
        ("a" * 1024 * 1024 + "\n") * 2,
        "x" * (1024 * 1024) + "\n" + ASSERT_LINE,
    ],
    ids=["assert-starts", "assert-ends", "load-errors", "letters", "letters-then-assert"],
)
def test_the_child_check_reads_a_hostile_log_in_linear_time(log_tail: str) -> None:
    took = best_time_s(lambda: child_check.reason_from_log(log_tail))
    assert took < BUDGET_S_PER_MIB * 2  # two megabytes at most
    if log_tail.endswith(ASSERT_LINE):
        assert child_check.reason_from_log(log_tail) == ASSERTION


def test_a_printf_template_of_unclosed_keys_is_refused_quickly() -> None:
    template = "%(" * (512 * 1024)
    took = best_time_s(lambda: template_limits.printf_size(template, {}, 1 << 20))
    assert took < BUDGET_S_PER_MIB
    assert template_limits.printf_size(template, {}, 1 << 20) > 1 << 20  # refused, not read


def test_a_printf_key_is_still_read() -> None:
    size = template_limits.printf_size("%(name)10s!", {"name": "x" * 50}, 1 << 20)
    assert size >= len("%(name)10s!") + 50


def test_a_long_log_line_is_not_a_buffer_report_but_a_real_one_still_is() -> None:
    name_line = "print_info: general.name = " + "N" * (1024 * 1024)
    real = "load_tensors:   CPU_Mapped model buffer size =   235.16 MiB"
    started = time.thread_time()
    report = load_report.parse_load_log([name_line, name_line + " model buffer size = 1 MiB", real])
    assert time.thread_time() - started < 2 * BUDGET_S_PER_MIB * 2
    assert report.model_bytes == round(235.16 * 1024 * 1024)


def test_a_users_override_pattern_meets_at_most_llamas_longest_tensor_name() -> None:
    from hearthside.core.engine.config import EngineConfig, TensorOverride

    config = EngineConfig("model.gguf", tensor_overrides=(TensorOverride(r".*ffn_.*_exps", "CPU"),))
    placement = autotune_memory.LayerPlacement(4, config, ["CUDA0"])
    hostile = autotune_memory.WeightPiece("blk.0.ffn_" * 6553, 0, 1, ("F32",), matmul=True)
    real = autotune_memory.WeightPiece("blk.0.ffn_up_exps.weight", 0, 1, ("F32",), matmul=True)
    took = best_time_s(lambda: autotune_memory.device_of_piece(hostile, placement, config))
    assert took < BUDGET_S_PER_MIB
    assert autotune_memory.device_of_piece(real, placement, config) == "CPU"

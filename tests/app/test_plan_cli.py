"""`hearthside plan`: a model's settings on this or another machine, as text or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hearthside.app.cli import main
from tests.fixtures.synthetic_gguf import write_synthetic_gguf
from tests.gguf_samples import register_tiny_variants

SPECS = Path(__file__).parents[1] / "fixtures" / "probe" / "specs"


def test_a_catalog_model_on_a_what_if_machine_prints_a_json_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        ["plan", "llama-3.1-70b", "--hardware-spec", str(SPECS / "two-rtx-3090.json"), "--json"]
    )
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    assert plan["fits"] and plan["config"]["n_gpu_layers"] == -1
    assert {device["device"] for device in plan["devices"]} == {"CPU", "CUDA0", "CUDA1"}
    assert plan["speed"]["decode_tps"] > 0 and plan["reasons"]


def test_a_descriptor_file_plans_without_a_model_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    descriptor = tmp_path / "my-moe.json"
    descriptor.write_text(
        json.dumps(
            {
                "schema": 1,
                "name": "My 30B-A3B",
                "architecture": "qwen3moe",
                "total_params": 30532122624,
                "layers": 48,
                "hidden_size": 2048,
                "heads": 32,
                "kv_heads": 4,
                "head_dim": 128,
                "experts": 128,
                "experts_used": 8,
                "expert_ffn_size": 768,
                "context": 40960,
                "vocab_size": 151936,
                "quant": "Q4_K_M",
            }
        )
    )
    code = main(["plan", str(descriptor), "--hardware-spec", str(SPECS / "mac-m3-ultra.json")])
    text = capsys.readouterr().out
    assert code == 0
    assert text.startswith("My 30B-A3B: fits")
    assert "MTL0" in text and "Why" in text


def test_the_default_model_plans_for_this_machine(
    default_model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", str(default_model_file), "--goal", "longest-context", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    assert plan["config"]["n_ctx"] == 32768  # the model's trained context
    assert plan["config"]["type_k"] == "f16"  # fits at full precision, so it stays


def test_an_unknown_model_says_how_to_name_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "catalog id" in err


def test_a_model_bigger_than_memory_is_planned_to_stream_from_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hardware = tmp_path / "small.json"
    hardware.write_text(json.dumps({"schema": 1, "gpus": [{"model": "t4"}], "memory_gb": 32}))
    code = main(["plan", "deepseek-v3", "--hardware-spec", str(hardware), "--ctx", "4096"])
    out = capsys.readouterr().out
    assert code == 0
    assert "streams from disk" in out and "bound by the disk" in out
    assert "Advice" in out


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tiny-variants")
    return {
        quant: write_synthetic_gguf(folder / f"tiny-{quant.lower()}.gguf", "tiny-dense", quant)
        for quant in ("Q8_0", "Q4_0")
    }


@pytest.fixture
def installed_variants(tiny_files: dict[str, Path]) -> str:
    """A small synthetic model installed as Q8_0, with a Q4_0 variant made from it."""
    register_tiny_variants(tiny_files)
    return "tiny-q4_0"


def test_a_model_with_variants_shows_the_chosen_one_and_the_others(
    installed_variants: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = str(SPECS / "two-rtx-3090.json")
    code = main(["plan", installed_variants, "--hardware-spec", spec, "--goal", "quality"])
    text = capsys.readouterr().out
    assert code == 0
    first = text.splitlines()[0]
    assert first.startswith("Variant   Q8_0 (tiny-q8_0) chosen for goal quality")
    assert "Q4_0 (tiny-q4_0)" in text
    assert "Q2_K (can be made from tiny-q8_0)" in text


def test_variants_as_json_name_the_choice_and_the_runners_up(
    installed_variants: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = str(SPECS / "two-rtx-3090.json")
    code = main(
        ["plan", installed_variants, "--hardware-spec", spec, "--goal", "fastest", "--json"]
    )
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    chosen = document["variants"]["chosen"]
    assert chosen["can_be_made"] and chosen["variant"] == "Q2_K"  # the fewest bytes per token
    assert document["config"]["n_gpu_layers"] == -1  # the chosen variant's Plan, as before
    assert {row["variant"] for row in document["variants"]["runners_up"]} >= {"Q8_0", "Q4_0"}

    main(["plan", installed_variants, "--hardware-spec", spec, "--goal", "fastest", "--json",
          "--installed-only"])  # fmt: skip
    only = json.loads(capsys.readouterr().out)["variants"]
    assert only["chosen"]["variant"] == "Q4_0"
    assert not any(row["can_be_made"] for row in only["runners_up"])


def what_if(tmp_path: Path, **spec: object) -> str:
    hardware = tmp_path / "machine.json"
    hardware.write_text(json.dumps({"schema": 1, **spec}))
    return str(hardware)


def test_the_plan_prints_its_slots_and_their_kv_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hardware = what_if(tmp_path, gpus=[{"model": "rtx-3090"}], memory_gb=32)
    assert main(["plan", "llama-3.1-8b", "--hardware-spec", hardware, "--ctx", "8192"]) == 0
    text = capsys.readouterr().out
    slots = next(line for line in text.splitlines() if line.startswith("Slots "))
    assert slots.startswith(
        "Slots     4 parallel requests × 8192 tokens: KV cache for 32768 tokens, "
    )
    assert slots.endswith(" GiB")
    assert "Why       n_parallel = 4: 4 requests at once" in text

    assert (
        main(["plan", "llama-3.1-8b", "--hardware-spec", hardware, "--ctx", "8192", "--json"]) == 0
    )
    document = json.loads(capsys.readouterr().out)
    assert document["config"]["n_parallel"] == 4 and document["config"]["n_ctx"] == 8192
    assert document["slots"]["total_context"] == 32768
    assert document["slots"]["text"] == slots.removeprefix("Slots     ")
    kv = sum(device["kv_bytes"] for device in document["devices"])
    assert document["slots"]["kv_bytes"] == kv


def test_parallel_asked_for_is_planned_or_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hardware = what_if(tmp_path, memory_gb=8)
    code = main(["plan", "llama-3.1-8b", "--hardware-spec", hardware, "--parallel", "2",
                 "--ctx", "4096", "--json"])  # fmt: skip
    document = json.loads(capsys.readouterr().out)
    assert code == 0 and document["fits"] and document["config"]["n_parallel"] == 2
    code = main(["plan", "llama-3.1-8b", "--hardware-spec", hardware, "--parallel", "64",
                 "--ctx", "8192"])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 3  # NOTHING_FITS
    assert "Advice    64 parallel requests of 8192 tokens each do not fit" in text
    assert "(--parallel " in text


@pytest.mark.parametrize("value", ["0", "65", "two", "-1"])
def test_parallel_outside_1_to_64_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "llama-3.1-8b", "--parallel", value])
    assert exit_.value.code == 2
    assert "parallel requests are a whole number from 1 to 64" in capsys.readouterr().err


def test_the_default_model_on_a_roomy_machine_keeps_a_full_precision_kv_cache(
    chat_model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Memory forces nothing here, so a quantized cache (its speed gain only predicted, its
    cost to the answers real) is not chosen; and the plan's context is the chat's."""
    from hearthside.core.settings import Settings

    roomy = what_if(tmp_path, memory_gb=32)
    for goal in ("balanced", "fastest", "quality"):
        code = main(["plan", str(chat_model_file), "--hardware-spec", roomy, "--goal", goal,
                     "--json"])  # fmt: skip
        document = json.loads(capsys.readouterr().out)
        assert code == 0 and document["config"]["type_k"] == "f16", goal
    assert document["config"]["n_ctx"] == Settings().context_size
    assert main(["plan", str(chat_model_file), "--hardware-spec", roomy]) == 0
    text = capsys.readouterr().out
    assert "Full-precision KV cache" in text and "budget" not in text.split("KV cache")[1][:80]


def test_a_plan_names_one_bound_for_generation(
    chat_model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(chat_model_file)]) == 0
    text = capsys.readouterr().out
    speed = next(line for line in text.splitlines() if line.startswith("Speed "))
    bound = speed.split("bound by ")[1].split(")")[0]
    decode = next(line for line in text.splitlines() if "decode = " in line)
    assert ("memory" in bound) == ("memory-bandwidth-bound" in decode), (speed, decode)
    assert ("compute" in bound) == ("compute-bound" in decode), (speed, decode)
    assert "memory-bound" not in text.replace("memory-bandwidth-bound", "")


def test_an_8b_model_on_two_cores_fits_but_is_called_slow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    two_cores = what_if(tmp_path, memory_gb=24, cpu={"cores": 2, "threads": 2, "flags": ["avx2"]})
    assert main(["plan", "llama-3.1-8b", "--hardware-spec", two_cores]) == 0
    headline = capsys.readouterr().out.splitlines()[0]
    assert headline.startswith("Llama 3.1 8B: fits, but slow here (~"), headline
    assert "tok/s; first answer after ~" in headline
    # a GPU that holds it: no such warning
    gpu = what_if(tmp_path, gpus=[{"model": "rtx-3090"}], memory_gb=32)
    assert main(["plan", "llama-3.1-8b", "--hardware-spec", gpu]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("Llama 3.1 8B: fits (goal")

"""Golden serving recipes for the three example setups, the memory invariants behind them, and
the flag check that keeps a mistyped option out of every emitted command."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from hearthside.autotune.planner import experts_on_cpu
from hearthside.autotune.serving import (
    FULL_LENGTH_REQUESTS,
    MIN_MODEL_LEN,
    RecipeError,
    RecipeFlagError,
    ServingPlan,
    check_command,
    llama_server_command,
    llama_server_options,
    llama_server_recipe,
    plan_vllm,
    vllm_command,
    vllm_options,
)
from hearthside.core.models.catalog import catalog_ids, catalog_spec
from hearthside.core.probe.spec import ClusterSpec, expand_cluster_spec, load_cluster_spec

pytestmark = pytest.mark.beside

ASSETS = Path(str(resources.files("hearthside.assets")))
EXAMPLES = ("2x-rtx-3090", "8x-h100", "2x-dgx-spark")
GIB = 1 << 30


def example(name: str) -> ClusterSpec:
    return load_cluster_spec(ASSETS / f"hardware-example-{name}.json")


def flags(argv: list[str]) -> dict[str, str | None]:
    """`--flag value` pairs of a command (a switch maps to None)."""
    found: dict[str, str | None] = {}
    for position, token in enumerate(argv):
        if token.startswith("-"):
            following = argv[position + 1] if position + 1 < len(argv) else "-"
            found[token] = None if following.startswith("-") else following
    return found


def assert_memory_adds_up(plan: ServingPlan) -> None:
    assert plan.gpus, "a plan that fits lists its GPUs"
    for gpu in plan.gpus:
        parts = gpu.weights_bytes + gpu.kv_bytes + gpu.overhead_bytes + gpu.free_bytes
        assert parts == pytest.approx(gpu.total_bytes, abs=1), gpu
        assert min(gpu.weights_bytes, gpu.kv_bytes, gpu.overhead_bytes, gpu.free_bytes) > 0
        used = gpu.total_bytes - gpu.free_bytes
        assert used == pytest.approx(gpu.total_bytes * plan.gpu_memory_utilization, abs=1)
        # the KV cache holds the planned number of full-length requests
        assert gpu.kv_tokens >= FULL_LENGTH_REQUESTS * plan.max_model_len, gpu
    assert len(plan.gpus) == plan.tensor_parallel_size * plan.pipeline_parallel_size


def assert_explained(plan: ServingPlan) -> None:
    settings = {reason.setting for reason in plan.reasons}
    assert settings >= {
        "checkpoint",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "kv_cache_dtype",
        "max_model_len",
        "gpu_memory_utilization",
        "enable_expert_parallel",
        "speculative_config",
    }
    assert all(len(reason.why) > 20 for reason in plan.reasons)


# --- golden recipes ---------------------------------------------------------------------------


def test_two_3090s_serve_qwen_32b_as_awq_over_both_gpus() -> None:
    plan = plan_vllm(catalog_spec("qwen2.5-32b"), example("2x-rtx-3090"))
    command = vllm_command(plan)
    assert command[:3] == ["vllm", "serve", "Qwen/Qwen2.5-32B-Instruct-AWQ"]
    assert flags(command) == {
        "--tensor-parallel-size": "2",
        "--pipeline-parallel-size": "1",
        "--quantization": "awq_marlin",
        "--kv-cache-dtype": "auto",  # sm_86 has no FP8
        "--max-model-len": "32768",  # the trained context, twice over in 2 x 11 GiB of KV
        "--gpu-memory-utilization": "0.90",
    }
    assert plan.checkpoint_format == "awq-int4" and plan.checkpoint_known
    assert plan.cluster is None and plan.distributed_executor_backend is None
    assert_memory_adds_up(plan)
    assert_explained(plan)
    weights = plan.gpus[0].weights_bytes
    assert 8 * GIB < weights < 11 * GIB  # ~19 GB of 4-bit weights, halved by TP=2


def test_two_3090s_fit_llama_70b_awq_only_with_a_short_context() -> None:
    plan = plan_vllm(catalog_spec("llama-3.1-70b"), example("2x-rtx-3090"))
    command = vllm_command(plan)
    assert command[2] == "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"
    assert flags(command)["--tensor-parallel-size"] == "2"
    assert flags(command)["--quantization"] == "awq_marlin"
    assert MIN_MODEL_LEN <= plan.max_model_len < 16384
    assert plan.speculative_config is None  # the 1B draft would eat the KV cache
    why = {reason.setting: reason.why for reason in plan.reasons}
    assert "Llama-3.2-1B" in why["speculative_config"]
    assert "no FP8" in why["checkpoint"]
    assert plan.advice  # says the context is short
    assert_memory_adds_up(plan)


def test_eight_h100s_serve_llama_405b_in_fp8_with_a_draft_model() -> None:
    plan = plan_vllm(catalog_spec("llama-3.1-405b"), example("8x-h100"))
    command = vllm_command(plan)
    found = flags(command)
    assert command[2] == "meta-llama/Llama-3.1-405B-Instruct"
    assert found["--tensor-parallel-size"] == "8" and found["--pipeline-parallel-size"] == "1"
    assert found["--quantization"] == "fp8" and found["--kv-cache-dtype"] == "fp8"
    assert found["--max-model-len"] == "131072"
    assert "--distributed-executor-backend" not in found
    assert "--enable-expert-parallel" not in found  # dense
    speculative = json.loads(found["--speculative-config"] or "")
    assert speculative == {"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 4}
    assert_memory_adds_up(plan)
    assert_explained(plan)
    assert 45 * GIB < plan.gpus[0].weights_bytes < 52 * GIB  # 405 GB of FP8 over 8 GPUs


def test_eight_h100s_need_int4_for_deepseek_v3_with_expert_parallelism() -> None:
    plan = plan_vllm(catalog_spec("deepseek-v3"), example("8x-h100"))
    found = flags(vllm_command(plan))
    # 671 GB of native FP8 exceeds 8 x 72 GiB; the 4-bit AWQ conversion fits
    assert plan.checkpoint == "cognitivecomputations/DeepSeek-V3-AWQ"
    assert found["--quantization"] == "awq_marlin" and found["--tensor-parallel-size"] == "8"
    assert "--enable-expert-parallel" in found and found["--enable-expert-parallel"] is None
    assert found["--kv-cache-dtype"] == "auto"  # latent attention keeps its own dtype
    assert plan.speculative_config is None  # the MTP head is only in the FP8 checkpoint
    assert_memory_adds_up(plan)


def test_eight_h200s_serve_native_fp8_deepseek_v3_with_its_mtp_head() -> None:
    cluster = expand_cluster_spec(
        {
            "schema": 1,
            "gpus": [{"model": "h200", "count": 8}],
            "memory_gb": 2048,
            "interconnect": {"gpu_link": "nvlink"},
        }
    )
    plan = plan_vllm(catalog_spec("deepseek-v3"), cluster)
    found = flags(vllm_command(plan))
    assert plan.checkpoint == "deepseek-ai/DeepSeek-V3" and found["--quantization"] == "fp8"
    assert json.loads(found["--speculative-config"] or "") == {
        "method": "deepseek_mtp",
        "num_speculative_tokens": 1,
    }
    assert "--enable-expert-parallel" in found
    assert_memory_adds_up(plan)


def test_two_dgx_sparks_pipeline_qwen3_235b_int4_over_ray() -> None:
    plan = plan_vllm(catalog_spec("qwen3-235b-a22b"), example("2x-dgx-spark"))
    found = flags(vllm_command(plan))
    assert plan.checkpoint == "Qwen/Qwen3-235B-A22B-GPTQ-Int4"
    assert found["--quantization"] == "gptq_marlin"
    assert found["--tensor-parallel-size"] == "1" and found["--pipeline-parallel-size"] == "2"
    assert found["--distributed-executor-backend"] == "ray"
    assert found["--gpu-memory-utilization"] == "0.80"  # unified memory: leave room for the OS
    assert found["--kv-cache-dtype"] == "fp8"  # GB10 is sm_121
    assert plan.nodes == 2 and [gpu.device for gpu in plan.gpus] == ["node0 GPU0", "node1 GPU0"]
    # the last stage also holds the sampler's logits, so its KV share is a little smaller
    assert plan.gpus[1].kv_bytes < plan.gpus[0].kv_bytes
    assert_memory_adds_up(plan)
    assert_explained(plan)
    cluster = plan.cluster
    assert cluster is not None and cluster.nodes == 2
    assert cluster.head_commands == (("ray", "start", "--head", "--port=6379"),)
    assert cluster.worker_commands == (("ray", "start", "--address=HEAD_IP:6379"),)
    names = {variable.name for variable in cluster.environment}
    assert {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} <= names
    assert all(variable.why for variable in cluster.environment)


def test_two_dgx_sparks_serve_gpt_oss_120b_from_one_node() -> None:
    plan = plan_vllm(catalog_spec("gpt-oss-120b"), example("2x-dgx-spark"))
    found = flags(vllm_command(plan))
    assert plan.checkpoint == "openai/gpt-oss-120b" and found["--quantization"] == "mxfp4"
    assert plan.nodes == 1 and plan.pipeline_parallel_size == 1 and plan.cluster is None
    assert found["--max-model-len"] == "131072"
    why = {reason.setting: reason.why for reason in plan.reasons}
    assert "another copy" in why["pipeline_parallel_size"]
    assert_memory_adds_up(plan)


def test_a_model_that_fits_nowhere_gets_advice_instead_of_a_command() -> None:
    plan = plan_vllm(catalog_spec("deepseek-v3"), example("2x-rtx-3090"))
    assert not plan.fits and not plan.gpus
    assert any("does not fit" in line for line in plan.advice)
    with pytest.raises(RecipeError, match="does not fit"):
        vllm_command(plan)


def test_a_model_without_a_known_checkpoint_gets_a_placeholder_to_fill_in() -> None:
    spec = dataclasses.replace(
        catalog_spec("llama-3.1-70b"), name="My 70B", ref="/models/my-70b.gguf", source="gguf"
    )
    plan = plan_vllm(spec, example("8x-h100"))
    assert plan.fits and not plan.checkpoint_known
    assert plan.checkpoint.startswith("<") and "My 70B" in plan.checkpoint
    assert any("--checkpoint" in line for line in plan.advice)
    given = plan_vllm(spec, example("8x-h100"), checkpoint="me/my-70b")
    assert given.checkpoint_known and vllm_command(given)[2] == "me/my-70b"


def test_an_asked_for_context_is_served_when_it_fits() -> None:
    plan = plan_vllm(catalog_spec("qwen2.5-32b"), example("2x-rtx-3090"), max_model_len=8192)
    assert plan.max_model_len == 8192


def test_mixed_gpus_are_planned_like_the_smallest_and_oldest() -> None:
    cluster = expand_cluster_spec(
        {"schema": 1, "gpus": [{"model": "rtx-4090"}, {"model": "rtx-3090"}], "memory_gb": 64}
    )
    plan = plan_vllm(catalog_spec("qwen2.5-14b"), cluster)
    assert plan.fits and plan.tensor_parallel_size == 2
    assert plan.kv_cache_dtype == "auto"  # the RTX 3090 (sm_86) has no FP8
    assert plan.checkpoint_format != "fp8"
    assert_memory_adds_up(plan)


@pytest.mark.parametrize("hardware", EXAMPLES)
def test_every_catalog_model_either_fits_with_a_checked_command_or_gets_advice(
    hardware: str,
) -> None:
    cluster = example(hardware)
    for model_id in catalog_ids():
        plan = plan_vllm(catalog_spec(model_id), cluster)
        if plan.fits:
            check_command(vllm_command(plan), vllm_options())
            assert_memory_adds_up(plan)
            assert plan.tensor_parallel_size * plan.pipeline_parallel_size <= (
                cluster.nodes * cluster.gpus_per_node
            )
        else:
            assert plan.advice, model_id
        json.dumps(plan.to_dict())  # the --json output


# --- llama-server from the local plan ---------------------------------------------------------


def test_llama_server_recipe_realises_the_local_plan_on_two_gpus() -> None:
    recipe = llama_server_recipe(catalog_spec("llama-3.1-70b"), example("2x-rtx-3090"))
    local = recipe.plan
    command = llama_server_command(local, model_args=recipe.model_args)
    found = flags(command)
    assert command[0] == "llama-server"
    assert found["-hf"] == "bartowski/Meta-Llama-3.1-70B-Instruct-GGUF:Q4_K_M"
    assert found["-ngl"] == (
        "999" if local.config.n_gpu_layers == -1 else str(local.config.n_gpu_layers)
    )
    assert found["-ts"] == "1,1" and found["-sm"] == "layer"
    assert found["-c"] == str(local.config.total_context)
    assert found["-fa"] == ("on" if local.config.flash_attn else "off")
    assert found["--cache-type-k"] == local.config.type_k
    assert found["--host"] == "127.0.0.1"
    assert {reason.setting for reason in recipe.reasons} >= {"model", "tensor_split", "split_mode"}


def test_llama_server_gets_the_plans_slots_and_their_whole_context() -> None:
    local = llama_server_recipe(catalog_spec("llama-3.1-8b"), example("2x-rtx-3090")).plan
    assert local.config.n_parallel == 4  # an 8B model on 48 GB leaves room for 4
    found = flags(llama_server_command(local))
    assert found["-np"] == "4" and found["-c"] == str(4 * local.config.n_ctx)


def test_llama_server_command_carries_the_plans_tensor_overrides() -> None:
    recipe = llama_server_recipe(catalog_spec("qwen3-30b-a3b"), example("2x-rtx-3090"))
    overrides = experts_on_cpu(12)
    local = dataclasses.replace(
        recipe.plan, config=recipe.plan.config.with_changes(tensor_overrides=overrides)
    )
    command = llama_server_command(local, model_args=["-m", "/models/qwen3-30b-a3b.gguf"])
    position = command.index("-ot")
    assert command[position + 1] == overrides[0].to_flag()
    assert command[position + 1].endswith("=CPU")


def test_a_multi_node_spec_gets_a_one_node_llama_server_recipe_and_a_warning() -> None:
    recipe = llama_server_recipe(catalog_spec("gpt-oss-120b"), example("2x-dgx-spark"))
    assert "-ts" not in llama_server_command(recipe.plan, model_args=recipe.model_args)
    assert any("RPC" in line for line in recipe.advice)


# --- the flag check ---------------------------------------------------------------------------


def test_a_mistyped_vllm_flag_is_caught_with_a_suggestion() -> None:
    plan = plan_vllm(catalog_spec("qwen2.5-32b"), example("2x-rtx-3090"))
    command = vllm_command(plan)
    mistyped = [
        "--tensor-paralel-size" if token == "--tensor-parallel-size" else token for token in command
    ]
    with pytest.raises(RecipeFlagError) as caught:
        check_command(mistyped, vllm_options())
    assert "--tensor-paralel-size" in str(caught.value)
    assert "--tensor-parallel-size" in (caught.value.hint or "")


@pytest.mark.parametrize(
    "argv",
    [
        ["vllm", "serve", "m", "--kv-cache-dtype", "fp16"],  # not among the choices
        ["vllm", "serve", "m", "--quantization", "awq-marlin"],
        ["vllm", "serve", "m", "--tensor-parallel-size", "two"],
        ["vllm", "serve", "m", "--speculative-config", "{method: mtp}"],  # not JSON
        ["vllm", "serve", "m", "--max-model-len"],  # no value
        ["vllm", "serve", "m", "extra-positional"],
        ["vllm", "run", "m"],
        ["vllm", "serve", "m", "--no-tensor-parallel-size"],  # only switches negate
    ],
)
def test_bad_vllm_commands_are_refused(argv: list[str]) -> None:
    with pytest.raises(RecipeFlagError):
        check_command(argv, vllm_options())


def test_vllm_accepts_aliases_inline_values_and_negated_switches() -> None:
    check_command(
        ["vllm", "serve", "m", "-tp", "4", "--max-model-len=8192", "--no-enable-prefix-caching"],
        vllm_options(),
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["llama-server", "-m", "x.gguf", "-fa", "maybe"],
        ["llama-server", "-m", "x.gguf", "--cache-type-k", "q8"],
        ["llama-server", "-m", "x.gguf", "-sm", "rows"],
        ["llama-server", "-m", "x.gguf", "--n-gpu-layer", "99"],
        ["llama-server", "x.gguf"],
    ],
)
def test_bad_llama_server_commands_are_refused(argv: list[str]) -> None:
    with pytest.raises(RecipeFlagError):
        check_command(argv, llama_server_options())


def test_recorded_option_lists_name_their_source_and_the_flags_recipes_use() -> None:
    for filename in ("vllm_cli_options.json", "llama_server_cli_options.json"):
        data: dict[str, Any] = json.loads((ASSETS / filename).read_text("utf-8"))
        assert data["recorded_from"] and data["version"]
        names = [name for option in data["options"] for name in option["names"]]
        assert len(names) == len(set(names)), filename
    vllm = vllm_options()
    for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "--enable-expert-parallel"):
        assert vllm.lookup(flag) is not None
    kv_dtype = vllm.lookup("--kv-cache-dtype")
    assert kv_dtype is not None and "fp8" in kv_dtype.choices
    backend = vllm.lookup("--distributed-executor-backend")
    assert backend is not None and "ray" in backend.choices
    quantization = vllm.lookup("--quantization")
    assert quantization is not None
    assert {"awq_marlin", "gptq_marlin", "fp8", "mxfp4"} <= set(quantization.choices)
    server = llama_server_options()
    split = server.lookup("-sm")
    assert split is not None and {"layer", "row"} <= set(split.choices)
    for flag in ("-ngl", "-ts", "-ot", "-c", "-fa", "--cache-type-k", "--cache-type-v", "-hf"):
        assert server.lookup(flag) is not None

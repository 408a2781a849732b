"""`hearthside recipe vllm|llama-server`: paste-ready commands, the memory table, reasons, JSON.

Run through the subcommand's own parser (the lead wires `add_recipe_parser` into cli.py)."""

from __future__ import annotations

import argparse
import json
import shlex
from importlib import resources
from pathlib import Path

import pytest

from hearthside.app.recipe_cli import NOTHING_FITS, add_recipe_parser
from hearthside.autotune.serving import check_command, llama_server_options, vllm_options
from hearthside.core.probe.spec import load_spec

pytestmark = pytest.mark.beside

ASSETS = Path(str(resources.files("hearthside.assets")))
SPARKS = str(ASSETS / "hardware-example-2x-dgx-spark.json")
RTX = str(ASSETS / "hardware-example-2x-rtx-3090.json")


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hearthside")
    add_recipe_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["recipe", *argv])
    return int(args.handler(args))


def pasted_command(text: str, program: str) -> list[str]:
    """The command as a shell would read the printed lines (continuations joined)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(program))
    block = []
    for line in lines[start:]:
        block.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(block))


def test_vllm_recipe_for_two_nodes_prints_ray_setup_command_memory_and_reasons(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run("vllm", "qwen3-235b-a22b", "--hardware-spec", SPARKS) == 0
    out = capsys.readouterr().out
    assert "export NCCL_SOCKET_IFNAME=IFNAME" in out and "export GLOO_SOCKET_IFNAME=" in out
    assert "ray start --head --port=6379" in out
    assert "ray start --address=HEAD_IP:6379" in out
    assert out.index("ray start --head") < out.index("vllm serve")
    command = pasted_command(out, "vllm serve")
    check_command(command, vllm_options())
    assert command[:3] == ["vllm", "serve", "Qwen/Qwen3-235B-A22B-GPTQ-Int4"]
    assert "--distributed-executor-backend" in command and "ray" in command
    assert "node0 GPU0" in out and "node1 GPU0" in out and "KV tokens" in out
    assert "Why       pipeline_parallel_size = 2:" in out


def test_vllm_recipe_json_is_the_whole_plan_and_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run("vllm", "llama-3.1-70b", "--hardware-spec", RTX, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tensor_parallel_size"] == 2 and data["checkpoint_format"] == "awq-int4"
    assert data["command"][:2] == ["vllm", "serve"]
    assert shlex.split(data["command_line"]) == data["command"]
    assert len(data["gpus"]) == 2 and data["reasons"]


def test_the_speculative_config_survives_shell_quoting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        run(
            "vllm",
            "llama-3.1-405b",
            "--hardware-spec",
            str(ASSETS / "hardware-example-8x-h100.json"),
        )
        == 0
    )
    command = pasted_command(capsys.readouterr().out, "vllm serve")
    config = json.loads(command[command.index("--speculative-config") + 1])
    assert config["model"] == "meta-llama/Llama-3.2-1B-Instruct"


def test_a_model_that_does_not_fit_gets_advice_and_exit_status_3(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run("vllm", "deepseek-v3", "--hardware-spec", RTX) == NOTHING_FITS
    out = capsys.readouterr().out
    assert "does not fit" in out and "Advice" in out and "vllm serve" not in out


def test_llama_server_recipe_from_a_what_if_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("llama-server", "llama-3.1-70b", "--hardware-spec", RTX, "--port", "8181") == 0
    out = capsys.readouterr().out
    command = pasted_command(out, "llama-server")
    check_command(command, llama_server_options())
    assert command[command.index("-ts") + 1] == "1,1"
    assert command[command.index("--port") + 1] == "8181"
    assert "CUDA0" in out and "CUDA1" in out and "Why       split_mode = layer" in out


def test_llama_server_recipe_from_a_saved_profile_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(load_spec(RTX).to_json(), "utf-8")
    assert run("llama-server", "qwen2.5-32b", "--hardware", str(profile), "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["command"][0] == "llama-server"
    config, command = data["plan"]["config"], data["command"]
    # llama-server's -c is every slot's context together, shared out over -np slots
    assert config["n_ctx"] * config["n_parallel"] == int(command[command.index("-c") + 1])
    assert config["n_parallel"] == (
        int(command[command.index("-np") + 1]) if "-np" in command else 1
    )
    assert data["model_args"] == ["-hf", "Qwen/Qwen2.5-32B-Instruct-GGUF:Q4_K_M"]


def test_a_missing_spec_file_is_a_plain_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("vllm", "qwen2.5-32b", "--hardware-spec", str(tmp_path / "nope.json")) == 2
    assert "error: Cannot read the hardware spec" in capsys.readouterr().err

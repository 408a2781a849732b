"""`hearthside remote …`, `chat --model remote:NAME` and `serve --model remote:NAME` (the Local
API as a proxy), against llama-cpp-python's server on the default model in its own process."""

from __future__ import annotations

import argparse
import io
import json
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from hearthside.app.remote_cli import add_remote_parser
from hearthside.app.terminal_chat import ChatOptions, run_one_prompt
from hearthside.core.engine.remotes import RemoteRegistry
from tests.remote_peer import ServerProcess, hearthside_serve, llama_cpp_server

pytestmark = pytest.mark.beside

PEER_KEY = "cli-peer-key-0123456789"
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France?"}
]


@pytest.fixture(scope="module")
def peer(default_model_file: Path) -> Iterator[ServerProcess]:
    with llama_cpp_server(default_model_file, PEER_KEY) as server:
        yield server


def remote_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hearthside")
    add_remote_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["remote", *argv])
    return int(args.handler(args))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture()
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "peer.key"
    path.write_text(PEER_KEY + "\n")
    return path


def test_add_list_remove_keep_the_key_private(
    key_file: Path, hearthside_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_option = ("--api-key-file", str(key_file))
    assert remote_cli("add", "gpu-box", "http://10.0.0.7:8000", *key_option) == 0
    assert remote_cli("add", "ollama", "http://127.0.0.1:11434/v1", "--model", "qwen3:8b") == 0
    stored_key = hearthside_home / "remote-keys" / "gpu-box.key"
    assert stored_key.read_text().strip() == PEER_KEY
    assert mode(stored_key) == 0o600 and mode(hearthside_home / "remotes.json") == 0o600
    assert PEER_KEY not in (hearthside_home / "remotes.json").read_text()

    assert remote_cli("list") == 0
    table = capsys.readouterr().out
    assert "gpu-box  http://10.0.0.7:8000/v1    (first listed)  set" in table
    assert "ollama   http://127.0.0.1:11434/v1  qwen3:8b        none" in table
    assert remote_cli("list", "--json") == 0
    listed = json.loads(capsys.readouterr().out)["remotes"]
    assert [(r["name"], r["key"]) for r in listed] == [("gpu-box", "set"), ("ollama", "none")]

    assert remote_cli("remove", "gpu-box") == 0
    assert not stored_key.exists()
    assert [r.name for r in RemoteRegistry().all()] == ["ollama"]
    assert PEER_KEY not in capsys.readouterr().out


def test_the_key_can_come_from_stdin(
    hearthside_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("from-stdin-key\n"))
    assert remote_cli("add", "box", "http://127.0.0.1:8000", "--api-key-stdin") == 0
    assert (hearthside_home / "remote-keys" / "box.key").read_text() == "from-stdin-key\n"


def test_mistakes_are_explained(capsys: pytest.CaptureFixture[str], key_file: Path) -> None:
    assert remote_cli("add", "box", "http://127.0.0.1:8000") == 0
    assert remote_cli("add", "box", "http://127.0.0.1:9000") == 2
    assert "already saved" in capsys.readouterr().err
    assert remote_cli("add", "box", "http://127.0.0.1:9000", "--replace") == 0
    assert RemoteRegistry().get("box").base_url == "http://127.0.0.1:9000/v1"
    assert remote_cli("add", "../evil", "http://127.0.0.1:9000") == 2
    assert "cannot be a remote's name" in capsys.readouterr().err
    assert remote_cli("add", "box2", "localhost:9000") == 2
    assert "is not a server address" in capsys.readouterr().err
    assert remote_cli("remove", "nothing-here") == 2
    assert "no remote server named 'nothing-here'" in capsys.readouterr().err
    key_file.write_text("two words\n")
    assert remote_cli("add", "box3", "http://127.0.0.1:9000", "--api-key-file", str(key_file)) == 2
    assert "characters a key cannot have" in capsys.readouterr().err


def test_models_lists_what_the_server_offers(
    peer: ServerProcess, key_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert remote_cli("add", "peer", peer.base_url, "--api-key-file", str(key_file)) == 0
    capsys.readouterr()
    assert remote_cli("models", "peer") == 0
    assert "gemma-3-270m-q4_k_m.gguf" in capsys.readouterr().out


def test_models_explains_a_server_that_is_down(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.remote_peer import free_port

    assert remote_cli("add", "gone", f"http://127.0.0.1:{free_port()}") == 0
    assert remote_cli("models", "gone") == 2
    assert "isn't answering — is it running?" in capsys.readouterr().err


def test_terminal_chat_answers_through_a_remote(
    peer: ServerProcess, key_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert remote_cli("add", "peer", peer.base_url, "--api-key-file", str(key_file)) == 0
    options = ChatOptions(model="remote:peer", temperature=0, max_tokens=8, show_stats=True)
    assert run_one_prompt(options, "What is the capital of France?") == 0
    captured = capsys.readouterr()
    assert "Paris" in captured.out
    assert "Connecting to the server at" in captured.err and "8 tokens" in captured.err


def test_serve_proxies_a_remote_for_the_openai_client(
    peer: ServerProcess, key_file: Path, hearthside_home: Path
) -> None:
    assert remote_cli("add", "peer", peer.base_url, "--api-key-file", str(key_file)) == 0
    with hearthside_serve("remote:peer", hearthside_home) as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key=proxy.api_key, max_retries=0)
        served = [model.id for model in client.models.list().data]
        assert [Path(model_id).name for model_id in served] == ["gemma-3-270m-q4_k_m.gguf"]

        whole = client.chat.completions.create(
            model="anything",
            messages=QUESTION,
            temperature=0,
            max_tokens=8,
        )
        text = whole.choices[0].message.content or ""
        assert "Paris" in text and whole.model == served[0]
        streamed = client.chat.completions.create(
            model="anything",
            messages=QUESTION,
            temperature=0,
            max_tokens=8,
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text

        with pytest.raises(openai.APIStatusError) as no_embeddings:
            client.embeddings.create(model="anything", input="hello")
        error = no_embeddings.value
        assert error.status_code == 502 and "embedding" in str(error.body)
        assert PEER_KEY not in str(error.body)
        assert httpx.get(f"{proxy.base_url}/models").status_code == 401  # its own key applies
        assert proxy.stop() in (0, 130)  # 130: the conventional exit after Ctrl-C
        assert "Traceback" not in proxy.stderr_text()

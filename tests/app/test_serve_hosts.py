"""`hearthside serve`'s bind address and Host names, as a user meets them: a real process on
the real default chat model, real HTTP clients on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hearthside.app.serve_cli import allowed_lan_hosts
from hearthside.core.server.keys import load_or_create_api_key

CLI = [sys.executable, "-m", "hearthside.app.cli"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("host", ["::ffff:127.0.0.1", "[::ffff:127.0.0.1]"])
def test_an_ipv4_mapped_host_is_refused_before_anything_loads(host: str) -> None:
    result = subprocess.run(
        [*CLI, "serve", "--host", host, "--no-key", "--port", str(free_port())],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode != 0
    assert "is the IPv4 address 127.0.0.1 written in IPv6 form" in result.stderr
    assert "Use --host 127.0.0.1 instead." in result.stderr
    assert "Errno" not in result.stderr and "Traceback" not in result.stderr
    assert "Loading" not in result.stderr and "Installing" not in result.stderr


def test_lan_host_names_get_the_port_clients_send() -> None:
    names = ["studio.local", "studio.local:9000", "192.168.1.20", "fe80::1", "[fe80::2]", " "]
    assert allowed_lan_hosts(names, 8765) == (
        "studio.local:8765",
        "studio.local:9000",
        "192.168.1.20:8765",
        "[fe80::1]:8765",
        "[fe80::2]:8765",
    )


def get(port: int, host: str, key: str) -> httpx.Response:
    headers = {"Host": host, "Authorization": f"Bearer {key}"}
    return httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=headers, timeout=10)


def wait_until_up(port: int, key: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, "hearthside serve exited early"
        try:
            if get(port, f"127.0.0.1:{port}", key).is_success:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not come up")


@pytest.mark.slow
def test_lan_mode_says_how_to_allow_a_name_and_honours_it(
    chat_model_file: Path, hearthside_home: Path
) -> None:
    port = free_port()
    process = subprocess.Popen(
        [*CLI, "serve", "--model", str(chat_model_file), "--host", "0.0.0.0", "--port", str(port),
         "--ctx", "512", "--lan-host", "studio.example"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        key = load_or_create_api_key(hearthside_home / "api_key")
        wait_until_up(port, key, process)
        assert get(port, f"studio.example:{port}", key).status_code == 200
        refused = get(port, f"other.example:{port}", key)
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert error["code"] == "host_not_allowed"
        assert "start it with `hearthside serve --lan-host NAME`" in error["message"]
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        finally:
            process.kill()
    assert process.stderr is not None
    startup = process.stderr.read()
    assert f"studio.example:{port}" in startup
    assert "add each one with --lan-host NAME" in startup
    assert "Traceback" not in startup

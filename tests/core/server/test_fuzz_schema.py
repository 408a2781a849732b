"""schemathesis fuzzes every route from the server's own OpenAPI schema: no 5xx, ever."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController

pytestmark = pytest.mark.beside

KEY = "fuzz-key-" + "y" * 24


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def small_server(default_model_file: Path) -> Iterator[str]:
    # A tiny reply cap keeps each fuzzed generation short; a deep queue keeps 503s out.
    service = EngineService(max_queue=64).start()
    service.load(EngineConfig(model_path=str(default_model_file), n_ctx=512)).result()
    settings = ServerSettings(port=free_port(), api_key=KEY, max_tokens_cap=8, model_id="m")
    controller = ServerController(settings, service)
    controller.start()
    yield f"http://127.0.0.1:{settings.port}"
    controller.stop()
    service.stop()


@pytest.mark.slow
def test_no_route_answers_5xx_to_generated_requests(small_server: str, tmp_path: Path) -> None:
    command = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert command is not None, "schemathesis is a dev dependency"
    result = subprocess.run(
        [
            command, "run", f"{small_server}/openapi.json",
            "--checks", "not_a_server_error",
            "--header", f"Authorization: Bearer {KEY}",
            "--max-examples", "10",
            "--request-timeout", "60",
            "--generation-deterministic",
            "--phases", "examples,coverage,fuzzing",
        ],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,  # keeps its cache out of git
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]

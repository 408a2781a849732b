"""Which front end `hearthside` opens, and `hearthside gui` where there is no display."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hearthside.app.cli import _with_default_command, build_parser
from hearthside.app.gui_cli import NO_DISPLAY_NOTICE, bare_command, display_available

pytestmark = pytest.mark.beside

LINUX = "linux"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, False),
        ({"DISPLAY": ":0"}, True),
        ({"WAYLAND_DISPLAY": "wayland-0"}, True),
        ({"DISPLAY": ""}, False),
        ({"QT_QPA_PLATFORM": "offscreen"}, True),
        ({"QT_QPA_PLATFORM": "minimal"}, True),
        ({"QT_QPA_PLATFORM": "vnc:size=800x600"}, True),
        ({"QT_QPA_PLATFORM": "xcb"}, False),
        ({"QT_QPA_PLATFORM": "xcb", "DISPLAY": ":1"}, True),
        ({"QT_QPA_PLATFORM": "wayland-egl"}, False),
        ({"QT_QPA_PLATFORM": "wayland;xcb", "DISPLAY": ":1"}, True),
    ],
)
def test_display_detection_on_linux(env: dict[str, str], expected: bool) -> None:
    assert display_available(env, LINUX) is expected


def test_macos_and_windows_always_have_a_display() -> None:
    assert display_available({}, "darwin") and display_available({}, "win32")


def test_bare_hearthside_opens_the_window_or_falls_back_with_a_notice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert bare_command({"DISPLAY": ":0"}, LINUX) == "gui"
    assert capsys.readouterr().err == ""
    assert bare_command({}, LINUX) == "chat"
    notice = capsys.readouterr().err
    assert notice == NO_DISPLAY_NOTICE + "\n" and notice.count("\n") == 1


def test_the_default_command_follows_the_display(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "platform", LINUX)
    assert _with_default_command([]) == ["chat"]
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert _with_default_command([]) == ["gui"]
    assert _with_default_command(["--stats"]) == ["chat", "--stats"]  # chat options: chat
    assert _with_default_command(["models", "list"]) == ["models", "list"]


def test_gui_takes_the_model_options() -> None:
    args = build_parser().parse_args(["gui", "--model", "m", "--ctx", "2048", "--threads", "2"])
    assert (args.model, args.ctx, args.threads) == ("m", 2048, 2)


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="display variables are X11/Wayland"
)
def test_gui_without_a_display_is_a_plain_error() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["QT_QPA_PLATFORM"] = "xcb"
    result = subprocess.run(
        [sys.executable, "-m", "hearthside.app.cli", "gui"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: There is no display")
    assert "Traceback" not in result.stderr

"""`hearthside install-launcher`: real files in a temporary home, per platform.

Linux installs are validated with `desktop-file-validate`; the macOS bundle and Windows
shortcuts are planned here and checked by reading what would be written (the plist parses,
the launcher script runs, the PowerShell decodes and names the right paths, Qt reads the
.icns and .ico back).
"""

from __future__ import annotations

import argparse
import base64
import os
import plistlib
import shutil
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import QBuffer, QByteArray, QIODevice
from PySide6.QtGui import QImage, QImageReader

from hearthside.app.launcher import (
    APP_ID,
    ICO_SIZES,
    PNG_SIZES,
    IconSet,
    LauncherContext,
    desktop_entry,
    desktop_exec_argument,
    install,
    installed_files,
    manifest_path,
    plan_install,
    render_icons,
    uninstall,
    xdg_desktop_dir,
)
from hearthside.app.launcher_cli import add_launcher_parser
from hearthside.core.errors import HearthsideError

pytestmark = pytest.mark.beside

NEEDS_VALIDATOR = pytest.mark.skipif(
    shutil.which("desktop-file-validate") is None,
    reason="desktop-file-validate is missing (apt package desktop-file-utils)",
)


@pytest.fixture(scope="module")
def icons() -> IconSet:
    return render_icons()


def _context(tmp_path: Path, platform: str = "linux", **env: str) -> LauncherContext:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    # A path with a space, a quote and a dollar sign: quoting has to be right everywhere.
    executable = tmp_path / "my apps" / "it's $HOME" / "bin" / "hearthside"
    return LauncherContext(
        platform=platform,
        home=home,
        env=env,
        executable=executable,
        arguments=("gui",),
        data_root=tmp_path / "data",
        version="0.1.0",
    )


def _files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")} if folder.exists() else set()


def _validate(path: Path) -> None:
    result = subprocess.run(
        ["desktop-file-validate", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


# ---- Linux ------------------------------------------------------------------------------------


@NEEDS_VALIDATOR
def test_linux_install_writes_a_valid_entry_and_every_icon_size(
    tmp_path: Path, icons: IconSet
) -> None:
    ctx = _context(tmp_path, XDG_DATA_HOME=str(tmp_path / "xdg"))
    report = install(plan_install(ctx, icons), ctx.data_root, run=_no_commands)
    entry = tmp_path / "xdg" / "applications" / f"{APP_ID}.desktop"
    assert entry in report.written
    _validate(entry)
    exec_line = next(line for line in entry.read_text().splitlines() if line.startswith("Exec="))
    # Spec quoting: the reserved `$` and the backslash are escaped, then backslashes doubled.
    assert exec_line == f'Exec="{tmp_path}/my apps/it\'s \\\\$HOME/bin/hearthside" gui'
    for size in PNG_SIZES:
        png = tmp_path / "xdg" / "icons" / "hicolor" / f"{size}x{size}" / "apps" / f"{APP_ID}.png"
        image = QImage(str(png))
        assert (image.width(), image.height()) == (size, size)
        assert image.pixelColor(size // 2, size // 2).alpha() == 255  # drawn, not blank
    svg = tmp_path / "xdg" / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg"
    assert svg.read_bytes() == icons.svg


def test_xdg_data_home_defaults_to_dot_local_share(tmp_path: Path, icons: IconSet) -> None:
    ctx = _context(tmp_path)
    plan = plan_install(ctx, icons)
    assert plan.files[0].path == ctx.home / ".local/share/applications" / f"{APP_ID}.desktop"


@NEEDS_VALIDATOR
def test_desktop_copy_goes_to_the_users_desktop_folder_and_is_executable(
    tmp_path: Path, icons: IconSet
) -> None:
    ctx = _context(tmp_path)
    config = ctx.home / ".config"
    config.mkdir()
    (config / "user-dirs.dirs").write_text('XDG_DESKTOP_DIR="$HOME/Schreibtisch"\n')
    assert xdg_desktop_dir(ctx.home, ctx.env) == ctx.home / "Schreibtisch"
    install(plan_install(ctx, icons, desktop=True), ctx.data_root, run=_no_commands)
    copy = ctx.home / "Schreibtisch" / f"{APP_ID}.desktop"
    assert copy.stat().st_mode & stat.S_IXUSR
    _validate(copy)


def test_uninstall_removes_exactly_what_was_installed(tmp_path: Path, icons: IconSet) -> None:
    ctx = _context(tmp_path)
    applications = ctx.home / ".local/share/applications"
    applications.mkdir(parents=True)
    user_entry = applications / "someone-elses.desktop"
    user_entry.write_text("[Desktop Entry]\nType=Application\nName=Theirs\nExec=theirs\n")
    before = _files_under(ctx.home)
    report = install(plan_install(ctx, icons, desktop=True), ctx.data_root, run=_no_commands)
    assert set(installed_files(ctx.data_root)) == set(report.written)
    assert len(report.written) == 1 + len(PNG_SIZES) + 1 + 1  # entry, PNGs, SVG, desktop copy
    # A file the user puts into one of our new folders must survive, with the folder.
    hicolor_48 = ctx.home / ".local/share/icons/hicolor/48x48/apps"
    (hicolor_48 / "their-icon.png").write_bytes(b"not ours")
    removed = uninstall(ctx.data_root, run=_no_commands).removed
    assert set(removed) == set(report.written)
    assert _files_under(ctx.home) - before == {
        ctx.home / ".local/share/icons",
        ctx.home / ".local/share/icons/hicolor",
        ctx.home / ".local/share/icons/hicolor/48x48",
        hicolor_48,
        hicolor_48 / "their-icon.png",
    }
    assert user_entry.read_text().startswith("[Desktop Entry]")
    assert not manifest_path(ctx.data_root).exists()
    assert uninstall(ctx.data_root, run=_no_commands).removed == []  # nothing left to do


def test_a_launcher_file_the_user_changed_is_kept(tmp_path: Path, icons: IconSet) -> None:
    ctx = _context(tmp_path)
    install(plan_install(ctx, icons), ctx.data_root, run=_no_commands)
    entry = ctx.home / ".local/share/applications" / f"{APP_ID}.desktop"
    entry.write_text(entry.read_text().replace("Name=Hearthside", "Name=My AI"))
    report = uninstall(ctx.data_root, run=_no_commands)
    assert entry.exists() and [path for path, _why in report.kept] == [entry]


def test_install_refuses_to_overwrite_a_file_it_did_not_write(
    tmp_path: Path, icons: IconSet
) -> None:
    ctx = _context(tmp_path)
    entry = ctx.home / ".local/share/applications" / f"{APP_ID}.desktop"
    entry.parent.mkdir(parents=True)
    entry.write_text("[Desktop Entry]\nName=Packaged by my distro\n")
    with pytest.raises(HearthsideError, match="was not written by Hearthside"):
        install(plan_install(ctx, icons), ctx.data_root, run=_no_commands)
    assert "my distro" in entry.read_text() and not manifest_path(ctx.data_root).exists()


def test_installing_again_replaces_the_old_launcher(tmp_path: Path, icons: IconSet) -> None:
    ctx = _context(tmp_path)
    install(plan_install(ctx, icons, desktop=True), ctx.data_root, run=_no_commands)
    report = install(plan_install(ctx, icons, desktop=False), ctx.data_root, run=_no_commands)
    assert not (ctx.home / "Desktop" / f"{APP_ID}.desktop").exists()
    assert set(installed_files(ctx.data_root)) == set(report.written)


def test_the_desktop_database_is_refreshed_only_where_a_cache_exists(
    tmp_path: Path, icons: IconSet
) -> None:
    ctx = _context(tmp_path)
    assert plan_install(ctx, icons).refresh == ()
    applications = ctx.home / ".local/share/applications"
    applications.mkdir(parents=True)
    (applications / "mimeinfo.cache").write_text("[MIME Cache]\n")
    assert plan_install(ctx, icons).refresh == (
        ("update-desktop-database", "-q", str(applications)),
    )


def test_exec_arguments_follow_the_desktop_entry_quoting_rules() -> None:
    assert desktop_exec_argument("/usr/bin/hearthside") == "/usr/bin/hearthside"
    assert desktop_exec_argument("/opt/my app/hearthside") == '"/opt/my app/hearthside"'
    assert desktop_exec_argument('a"b') == '"a\\\\"b"'
    assert desktop_exec_argument("50%") == "50%%"
    assert desktop_exec_argument("") == '""'


# ---- the CLI ----------------------------------------------------------------------------------


def _cli(*args: str) -> int:
    parser = argparse.ArgumentParser()
    add_launcher_parser(parser.add_subparsers())
    parsed = parser.parse_args(["install-launcher", *args])
    return int(parsed.handler(parsed))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux layout")
def test_the_command_installs_dry_runs_and_uninstalls(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    hearthside_home: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "xdg"))
    monkeypatch.delenv("XDG_DESKTOP_DIR", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert _cli("--dry-run", "--desktop") == 0
    dry_run = capsys.readouterr().out
    assert f"would write {home}/xdg/applications/{APP_ID}.desktop" in dry_run
    assert f"would write {home}/Desktop/{APP_ID}.desktop" in dry_run
    assert _files_under(home) == set() and not manifest_path(hearthside_home).exists()
    assert _cli() == 0
    entry = home / "xdg" / "applications" / f"{APP_ID}.desktop"
    assert entry.exists() and f"wrote {entry}" in capsys.readouterr().out
    assert os.access(_exec_target(entry), os.X_OK)  # the environment's own `hearthside`
    assert _cli("--uninstall", "--dry-run") == 0 and entry.exists()
    assert _cli("--uninstall") == 0
    assert not entry.exists() and f"removed {entry}" in capsys.readouterr().out
    assert _files_under(home) == set()


def _exec_target(entry: Path) -> str:
    line = next(x for x in entry.read_text().splitlines() if x.startswith("TryExec="))
    return line.removeprefix("TryExec=")


# ---- macOS ------------------------------------------------------------------------------------


def test_macos_app_bundle_has_a_plist_a_working_launcher_and_an_icns(
    tmp_path: Path, icons: IconSet
) -> None:
    ctx = _context(tmp_path, platform="darwin")
    fake = ctx.executable
    fake.parent.mkdir(parents=True)
    # Stands in for `hearthside`: prints the arguments it was started with.
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n')
    fake.chmod(0o755)
    install(plan_install(ctx, icons), ctx.data_root, run=_no_commands)
    contents = ctx.home / "Applications" / "Hearthside.app" / "Contents"
    info = plistlib.loads((contents / "Info.plist").read_bytes())
    assert info["CFBundleExecutable"] == "Hearthside" and info["CFBundlePackageType"] == "APPL"
    assert info["CFBundleIdentifier"] == APP_ID and info["CFBundleShortVersionString"] == "0.1.0"
    launcher = contents / "MacOS" / "Hearthside"
    assert launcher.stat().st_mode & stat.S_IXUSR
    ran = subprocess.run([str(launcher), "-psn_0_1"], capture_output=True, text=True, check=True)
    assert ran.stdout.splitlines() == ["[gui]", "[-psn_0_1]"]
    icns = (contents / "Resources" / f"{info['CFBundleIconFile']}.icns").read_bytes()
    assert icns[:4] == b"icns" and int.from_bytes(icns[4:8], "big") == len(icns)
    assert _largest_image_side(icns, b"icns") == 1024


# ---- Windows ----------------------------------------------------------------------------------


def test_windows_shortcuts_are_made_by_powershell_with_the_right_paths(
    tmp_path: Path, icons: IconSet
) -> None:
    ctx = _context(
        tmp_path,
        platform="win32",
        APPDATA="C:\\Users\\O'Brien\\AppData\\Roaming",
        USERPROFILE="C:\\Users\\O'Brien",
    )
    ctx = replace(ctx, executable=Path("C:/venv/Scripts/hearthside.exe"))
    plan = plan_install(ctx, icons, desktop=True)
    [command] = plan.commands
    assert command[:2] == ("powershell.exe", "-NoProfile") and command[-2] == "-EncodedCommand"
    script = base64.b64decode(command[-1]).decode("utf-16-le")
    start_menu = "C:\\Users\\O''Brien\\AppData\\Roaming\\Microsoft\\Windows\\Start Menu\\Programs"
    assert f"CreateShortcut('{start_menu}\\Hearthside.lnk')" in script
    assert "CreateShortcut('C:\\Users\\O''Brien\\Desktop\\Hearthside.lnk')" in script
    assert "$shortcut.TargetPath = 'C:\\venv\\Scripts\\pythonw.exe'" in script  # no console
    assert "$shortcut.Arguments = '-m hearthside.app.cli gui'" in script
    assert script.count("$shortcut.Save()") == 2
    [icon] = plan.files
    assert icon.path.suffix == ".ico" and icon.content[:4] == b"\x00\x00\x01\x00"
    assert _image_count(icon.content, b"ico") == len(ICO_SIZES)
    assert _largest_image_side(icon.content, b"ico") == 256


def test_a_windows_bundle_shortcut_runs_the_bundle_itself(tmp_path: Path, icons: IconSet) -> None:
    ctx = _context(tmp_path, platform="win32", APPDATA="C:\\A", USERPROFILE="C:\\U")
    ctx = replace(ctx, executable=Path("D:/Hearthside/hearthside.exe"), frozen=True)
    script = base64.b64decode(plan_install(ctx, icons).commands[0][-1]).decode("utf-16-le")
    assert "$shortcut.TargetPath = 'D:\\Hearthside\\hearthside.exe'" in script
    assert "$shortcut.Arguments = 'gui'" in script


def test_the_committed_desktop_template_is_the_generated_entry() -> None:
    template = Path(__file__).parents[2] / "packaging" / "linux" / f"{APP_ID}.desktop"
    assert template.read_text(encoding="utf-8") == desktop_entry("hearthside")


# ---- helpers ----------------------------------------------------------------------------------


def _no_commands(command: object) -> subprocess.CompletedProcess[str]:
    raise AssertionError(f"no command should run here: {command}")


def _reader(data: bytes, kind: bytes) -> tuple[QImageReader, QBuffer]:
    buffer = QBuffer()
    buffer.setData(QByteArray(data))
    buffer.open(QIODevice.OpenModeFlag.ReadOnly)
    return QImageReader(buffer, QByteArray(kind)), buffer


def _image_count(data: bytes, kind: bytes) -> int:
    reader, _buffer = _reader(data, kind)
    return reader.imageCount()


def _largest_image_side(data: bytes, kind: bytes) -> int:
    reader, _buffer = _reader(data, kind)
    sides = []
    for index in range(reader.imageCount()):
        reader.jumpToImage(index)
        image = reader.read()
        assert not image.isNull(), reader.errorString()
        sides.append(image.width())
    return max(sides)

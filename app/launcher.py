"""`hearthside install-launcher`: an icon that opens Hearthside without a terminal.

Per platform, what goes where:
- Linux: an XDG desktop entry in `$XDG_DATA_HOME/applications` (default
  `~/.local/share/applications`) that runs this environment's `hearthside gui` by absolute
  path, the icon as PNGs in `$XDG_DATA_HOME/icons/hicolor/<n>x<n>/apps/` plus the SVG under
  `scalable/`, and with `--desktop` a copy of the entry on the desktop.
- macOS: `~/Applications/Hearthside.app` (Info.plist, a small launcher script in
  `Contents/MacOS`, a multi-size .icns).
- Windows: Start-menu (and with `--desktop` desktop) shortcuts, made by PowerShell through
  `WScript.Shell`, with an .ico in the data dir.

Planning is pure (`plan_install` takes the platform, home, environment, executable and icon
bytes and returns the files and commands), so every platform's output is testable here.
`install` writes the plan and records each file with its sha256 in a manifest in the data
dir; `uninstall` removes exactly those files (and the folders it created, once empty) and
leaves anything changed since, or anything that was never ours, alone.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import plistlib
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath

from hearthside.core.errors import HearthsideError

APP_NAME = "Hearthside"
# The desktop file's and icon's name, AppStream's id and Qt's desktopFileName (the Wayland
# app id), which must all agree; AppStream wants reverse-DNS.
APP_ID = "io.github.hearthside.Hearthside"
MANIFEST_NAME = "launcher.json"
MANIFEST_SCHEMA = 1
COMMAND_TIMEOUT_S = 60
PNG_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 256)
ICNS_SIZE = 1024  # the largest .icns slot (512@2x)
RENDER_SIZES = tuple(sorted({*PNG_SIZES, *ICO_SIZES, ICNS_SIZE}))
# .icns slots that take PNG data, and the pixel size each wants.
ICNS_SLOTS = (
    ("icp4", 16),
    ("icp5", 32),
    ("ic11", 32),
    ("icp6", 64),
    ("ic12", 64),
    ("ic07", 128),
    ("ic08", 256),
    ("ic13", 256),
    ("ic09", 512),
    ("ic14", 512),
    ("ic10", 1024),
)
COMMENT = "Chat with open-weight language models on this computer, tuned to it"
GENERIC_NAME = "Local AI Chat"
BUNDLE_IDENTIFIER = APP_ID
MACOS_MINIMUM = "11.0"

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


# ---- what gets written ------------------------------------------------------------------------


@dataclass(frozen=True)
class IconSet:
    """The app icon in every form the platforms want, all from assets/icon-app.svg."""

    svg: bytes
    png: Mapping[int, bytes]  # pixel size -> PNG

    def ico(self) -> bytes:
        return build_ico({size: self.png[size] for size in ICO_SIZES})

    def icns(self) -> bytes:
        return build_icns(self.png)


@dataclass(frozen=True)
class PlannedFile:
    path: Path
    content: bytes
    executable: bool = False


@dataclass(frozen=True)
class LauncherContext:
    """Everything about this machine the plan depends on (tests pass their own)."""

    platform: str  # sys.platform: "linux", "darwin", "win32"
    home: Path
    env: Mapping[str, str]
    executable: Path  # the `hearthside` command, or the bundle's binary
    arguments: tuple[str, ...]  # what follows it to open the window
    data_root: Path  # the data dir: the manifest (and Windows' .ico) live here
    version: str = "0"
    frozen: bool = False  # a PyInstaller bundle: `executable` is the app itself


@dataclass(frozen=True)
class LauncherPlan:
    platform: str
    files: tuple[PlannedFile, ...]
    commands: tuple[tuple[str, ...], ...] = ()  # run after the files are written
    made_by_commands: tuple[Path, ...] = ()  # files the commands create (Windows shortcuts)
    refresh: tuple[tuple[str, ...], ...] = ()  # run after install and after uninstall
    notes: tuple[str, ...] = ()


@dataclass
class InstallReport:
    written: list[Path] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class UninstallReport:
    removed: list[Path] = field(default_factory=list)
    kept: list[tuple[Path, str]] = field(default_factory=list)  # (path, why it was left)
    warnings: list[str] = field(default_factory=list)


# ---- icons ------------------------------------------------------------------------------------


def build_ico(pngs: Mapping[int, bytes]) -> bytes:
    """A Windows .ico holding PNG images (Vista and later read PNG entries)."""
    sizes = sorted(pngs)
    header = struct.pack("<HHH", 0, 1, len(sizes))
    offset = len(header) + 16 * len(sizes)
    entries, images = b"", b""
    for size in sizes:
        data = pngs[size]
        side = 0 if size >= 256 else size  # 0 means 256 in an ICONDIRENTRY
        entries += struct.pack("<BBBBHHII", side, side, 0, 0, 1, 32, len(data), offset)
        images += data
        offset += len(data)
    return header + entries + images


def build_icns(pngs: Mapping[int, bytes]) -> bytes:
    """A macOS .icns with a PNG in every slot whose size was rendered."""
    chunks = b"".join(
        kind.encode("ascii") + struct.pack(">I", 8 + len(pngs[size])) + pngs[size]
        for kind, size in ICNS_SLOTS
        if size in pngs
    )
    return b"icns" + struct.pack(">I", 8 + len(chunks)) + chunks


def render_icons(svg: bytes | None = None, sizes: Iterable[int] = RENDER_SIZES) -> IconSet:
    """Render the app icon SVG to PNGs with Qt's SVG renderer (no QApplication needed)."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize, Qt
    from PySide6.QtGui import QImage, QImageWriter, QPainter
    from PySide6.QtSvg import QSvgRenderer

    source = svg if svg is not None else app_icon_svg()
    renderer = QSvgRenderer(QByteArray(source))
    if not renderer.isValid():
        raise HearthsideError("The app icon could not be read.", hint="Reinstall Hearthside.")
    pngs: dict[int, bytes] = {}
    for size in sizes:
        image = QImage(QSize(size, size), QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        buffer = QBuffer()
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        QImageWriter(buffer, QByteArray(b"png")).write(image)
        pngs[size] = bytes(buffer.data().data())
    return IconSet(svg=source, png=pngs)


def app_icon_svg() -> bytes:
    from importlib.resources import files

    return (files("hearthside.assets") / "icon-app.svg").read_bytes()


# ---- Linux ------------------------------------------------------------------------------------

_EXEC_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


def desktop_exec_argument(argument: str) -> str:
    """One argument of an Exec= line, quoted by the Desktop Entry spec's rules.

    Inside double quotes, `"`, `` ` ``, `$` and `\\` take a backslash; then the value as a
    whole is a desktop-file string, where every backslash is doubled; `%` is written `%%`.
    """
    text = argument.replace("%", "%%")
    if text and not (_EXEC_RESERVED & set(text)):
        return text
    quoted = "".join("\\" + char if char in '"`$\\' else char for char in text)
    return '"' + quoted.replace("\\", "\\\\") + '"'


def desktop_string(value: str) -> str:
    """A desktop-file string value (no line breaks, backslashes doubled)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def desktop_entry(executable: Path | str, arguments: Sequence[str] = ("gui",)) -> str:
    """The Hearthside desktop entry; `packaging/linux/<APP_ID>.desktop` is this for
    `hearthside` on PATH (a test keeps the two equal)."""
    command = " ".join(desktop_exec_argument(part) for part in (str(executable), *arguments))
    lines = [
        "[Desktop Entry]",
        "Type=Application",
        "Version=1.4",
        f"Name={APP_NAME}",
        f"GenericName={GENERIC_NAME}",
        f"Comment={COMMENT}",
        f"Exec={command}",
        f"TryExec={desktop_string(str(executable))}",
        f"Icon={APP_ID}",
        "Terminal=false",
        "Categories=Utility;",
        "Keywords=LLM;AI;chat;llama;GGUF;assistant;",
        "StartupNotify=true",
        f"StartupWMClass={APP_ID}",
    ]
    return "\n".join(lines) + "\n"


def xdg_data_home(home: Path, env: Mapping[str, str]) -> Path:
    value = env.get("XDG_DATA_HOME", "")
    return Path(value) if value and Path(value).is_absolute() else home / ".local" / "share"


def xdg_desktop_dir(home: Path, env: Mapping[str, str]) -> Path:
    """The desktop folder: $XDG_DESKTOP_DIR, then ~/.config/user-dirs.dirs, then ~/Desktop."""
    if env.get("XDG_DESKTOP_DIR"):
        return Path(env["XDG_DESKTOP_DIR"].replace("$HOME", str(home)))
    config = Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "user-dirs.dirs"
    try:
        lines = config.read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        name, _, value = line.strip().partition("=")
        if name == "XDG_DESKTOP_DIR" and value:
            return Path(value.strip('"').replace("$HOME", str(home)))
    return home / "Desktop"


def plan_linux(ctx: LauncherContext, icons: IconSet, desktop: bool) -> LauncherPlan:
    data_home = xdg_data_home(ctx.home, ctx.env)
    applications = data_home / "applications"
    entry = desktop_entry(ctx.executable, ctx.arguments).encode("utf-8")
    hicolor = data_home / "icons" / "hicolor"
    files = [PlannedFile(applications / f"{APP_ID}.desktop", entry)]
    files += [
        PlannedFile(hicolor / f"{size}x{size}" / "apps" / f"{APP_ID}.png", icons.png[size])
        for size in PNG_SIZES
    ]
    files.append(PlannedFile(hicolor / "scalable" / "apps" / f"{APP_ID}.svg", icons.svg))
    if desktop:
        # File managers run a desktop-folder entry only when it is executable (and, on GNOME,
        # once the user allows launching it).
        desktop_copy = xdg_desktop_dir(ctx.home, ctx.env) / f"{APP_ID}.desktop"
        files.append(PlannedFile(desktop_copy, entry, executable=True))
    # The entry has no MimeType, so the MIME cache only needs refreshing where the desktop
    # already keeps one; running it elsewhere would leave a cache file nobody asked for.
    keeps_cache = (applications / "mimeinfo.cache").exists()
    refresh = (("update-desktop-database", "-q", str(applications)),) if keeps_cache else ()
    return LauncherPlan("linux", tuple(files), refresh=refresh)


# ---- macOS ------------------------------------------------------------------------------------


def info_plist(version: str) -> bytes:
    return plistlib.dumps(
        {
            "CFBundleDevelopmentRegion": "en",
            "CFBundleDisplayName": APP_NAME,
            "CFBundleExecutable": APP_NAME,
            "CFBundleIconFile": APP_ID,
            "CFBundleIdentifier": BUNDLE_IDENTIFIER,
            "CFBundleInfoDictionaryVersion": "6.0",
            "CFBundleName": APP_NAME,
            "CFBundlePackageType": "APPL",
            "CFBundleShortVersionString": version,
            "CFBundleVersion": version,
            "LSMinimumSystemVersion": MACOS_MINIMUM,
            "NSHighResolutionCapable": True,
        }
    )


def posix_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def macos_launcher_script(executable: Path | str, arguments: Sequence[str]) -> str:
    command = " ".join(posix_quote(part) for part in (str(executable), *arguments))
    # Finder starts apps with a bare environment: no shell profile, a minimal PATH.
    return f'#!/bin/sh\nexec {command} "$@"\n'


def plan_macos(ctx: LauncherContext, icons: IconSet, desktop: bool) -> LauncherPlan:
    contents = ctx.home / "Applications" / f"{APP_NAME}.app" / "Contents"
    files = (
        PlannedFile(contents / "Info.plist", info_plist(ctx.version)),
        PlannedFile(contents / "PkgInfo", b"APPL????"),
        PlannedFile(
            contents / "MacOS" / APP_NAME,
            macos_launcher_script(ctx.executable, ctx.arguments).encode("utf-8"),
            executable=True,
        ),
        PlannedFile(contents / "Resources" / f"{APP_ID}.icns", icons.icns()),
    )
    notes = (
        ("--desktop is not used on macOS: drag Hearthside from ~/Applications to the Dock.",)
        if desktop
        else ()
    )
    return LauncherPlan("macos", files, notes=notes)


# ---- Windows ----------------------------------------------------------------------------------


def powershell_quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def windows_command_line(arguments: Sequence[str]) -> str:
    return subprocess.list2cmdline(list(arguments))


def shortcut_script(
    shortcut: PureWindowsPath, target: str, arguments: Sequence[str], icon: PureWindowsPath
) -> str:
    """PowerShell that creates one .lnk through WScript.Shell."""
    return "\n".join(
        [
            f"New-Item -ItemType Directory -Force -Path {powershell_quote(str(shortcut.parent))}"
            " | Out-Null",
            "$shortcut = (New-Object -ComObject WScript.Shell).CreateShortcut("
            f"{powershell_quote(str(shortcut))})",
            f"$shortcut.TargetPath = {powershell_quote(target)}",
            f"$shortcut.Arguments = {powershell_quote(windows_command_line(arguments))}",
            f"$shortcut.IconLocation = {powershell_quote(str(icon) + ',0')}",
            f"$shortcut.Description = {powershell_quote(COMMENT)}",
            f"$shortcut.WorkingDirectory = {powershell_quote(str(PureWindowsPath(target).parent))}",
            "$shortcut.Save()",
        ]
    )


def powershell_command(script: str) -> tuple[str, ...]:
    # -EncodedCommand (UTF-16LE base64) keeps quotes and spaces away from CreateProcess.
    encoded = base64.b64encode(script.encode("utf-16-le")).decode("ascii")
    return (
        "powershell.exe",
        "-NoProfile",
        "-NonInteractive",
        "-ExecutionPolicy",
        "Bypass",
        "-EncodedCommand",
        encoded,
    )


def windows_gui_target(ctx: LauncherContext) -> tuple[str, tuple[str, ...]]:
    """What a shortcut runs: the environment's pythonw.exe (so no console window opens behind
    the app), or a bundle's own .exe."""
    executable = PureWindowsPath(str(ctx.executable))
    if ctx.frozen:
        return str(executable), ctx.arguments
    pythonw = executable.parent / "pythonw.exe"
    return str(pythonw), ("-m", "hearthside.app.cli", *ctx.arguments)


def plan_windows(ctx: LauncherContext, icons: IconSet, desktop: bool) -> LauncherPlan:
    appdata = PureWindowsPath(ctx.env.get("APPDATA") or f"{ctx.home}\\AppData\\Roaming")
    profile = PureWindowsPath(ctx.env.get("USERPROFILE") or str(ctx.home))
    icon_path = ctx.data_root / "launcher" / f"{APP_ID}.ico"
    shortcuts = [appdata / "Microsoft" / "Windows" / "Start Menu" / "Programs" / f"{APP_NAME}.lnk"]
    if desktop:
        shortcuts.append(profile / "Desktop" / f"{APP_NAME}.lnk")
    target, arguments = windows_gui_target(ctx)
    script = "\n".join(
        shortcut_script(link, target, arguments, PureWindowsPath(icon_path)) for link in shortcuts
    )
    return LauncherPlan(
        "windows",
        (PlannedFile(icon_path, icons.ico()),),
        commands=(powershell_command(script),),
        made_by_commands=tuple(Path(str(link)) for link in shortcuts),
    )


PLANNERS: dict[str, Callable[[LauncherContext, IconSet, bool], LauncherPlan]] = {
    "linux": plan_linux,
    "darwin": plan_macos,
    "win32": plan_windows,
}


def plan_install(ctx: LauncherContext, icons: IconSet, desktop: bool = False) -> LauncherPlan:
    """The files and commands that give this platform a Hearthside launcher. Pure."""
    family = "linux" if ctx.platform.startswith(("linux", "freebsd")) else ctx.platform
    planner = PLANNERS.get(family)
    if planner is None:
        raise HearthsideError(
            f"Hearthside has no launcher for this platform ({ctx.platform}).",
            hint="Start it from a terminal with `hearthside`.",
        )
    return planner(ctx, icons, desktop)


def describe_plan(plan: LauncherPlan) -> list[str]:
    """What installing `plan` would do, one line each (for --dry-run)."""
    lines = [f"write {item.path} ({len(item.content)} bytes)" for item in plan.files]
    lines += [f"run {_shown_command(command)}" for command in plan.commands]
    lines += [f"  (creates {path})" for path in plan.made_by_commands]
    lines += [f"run {_shown_command(command)} (if installed)" for command in plan.refresh]
    return lines + list(plan.notes)


def _shown_command(command: Sequence[str]) -> str:
    if command and command[0] == "powershell.exe":
        return "powershell.exe (creates the shortcuts through WScript.Shell)"
    return " ".join(command)


# ---- this machine -----------------------------------------------------------------------------


def hearthside_executable() -> Path:
    """The absolute path of the command that starts this installation of Hearthside."""
    if getattr(sys, "frozen", False):
        return Path(sys.executable).absolute()
    scripts = Path(sys.executable).absolute().parent  # a venv's bin/; never resolve the link
    name = "hearthside.exe" if os.name == "nt" else "hearthside"
    candidate = scripts / name
    if candidate.is_file():
        return candidate
    found = shutil.which("hearthside")
    if found:
        return Path(found).absolute()
    raise HearthsideError(
        "The `hearthside` command was not found next to this Python or on PATH.",
        hint="Run the setup command from the README (python3 bootstrap.py), then try again.",
    )


def this_machine(data_root: Path, version: str) -> LauncherContext:
    return LauncherContext(
        platform=sys.platform,
        home=Path.home(),
        env=dict(os.environ),
        executable=hearthside_executable(),
        arguments=("gui",),
        data_root=data_root,
        version=version,
        frozen=bool(getattr(sys, "frozen", False)),
    )


def run_command(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


# ---- install and uninstall --------------------------------------------------------------------


def manifest_path(data_root: Path) -> Path:
    return data_root / MANIFEST_NAME


def install(plan: LauncherPlan, data_root: Path, run: Runner = run_command) -> InstallReport:
    """Write `plan`, replacing an earlier launcher; record every file in the manifest."""
    _refuse_foreign_files(plan, data_root)
    uninstall(data_root, run=run, refresh=False)
    report = InstallReport()
    made_dirs: list[Path] = []
    try:
        for item in plan.files:
            made_dirs += _make_parents(item.path)
            _write(item)
            report.written.append(item.path)
        for command in plan.commands:
            _run_required(command, run)
            report.commands.append(_shown_command(command))
    finally:
        created = [*report.written, *(p for p in plan.made_by_commands if p.is_file())]
        _write_manifest(data_root, plan.platform, created, made_dirs)
    report.written += [p for p in plan.made_by_commands if p.is_file()]
    for command in plan.refresh:
        _run_optional(command, run, report.warnings)
    report.warnings += plan.notes
    return report


def uninstall(
    data_root: Path, run: Runner = run_command, *, refresh: bool = True
) -> UninstallReport:
    """Remove exactly what the last install wrote, unless it has changed since."""
    report = UninstallReport()
    manifest = _read_manifest(data_root)
    if manifest is None:
        return report
    for entry in manifest["files"]:
        path = Path(entry["path"])
        why = _why_keep(path, entry["sha256"])
        if why is None:
            path.unlink()
            report.removed.append(path)
        elif why != "already gone":
            report.kept.append((path, why))
    for folder in sorted(map(Path, manifest["dirs"]), key=lambda p: len(p.parts), reverse=True):
        _remove_if_empty(folder)
    manifest_path(data_root).unlink()
    if refresh and manifest["platform"] == "linux":
        for path in report.removed:
            cache_kept = (path.parent / "mimeinfo.cache").exists()
            if path.suffix == ".desktop" and path.parent.name == "applications" and cache_kept:
                _run_optional(("update-desktop-database", "-q", str(path.parent)), run, [])
    return report


def installed_files(data_root: Path) -> list[Path]:
    """The files the last install wrote (from the manifest)."""
    manifest = _read_manifest(data_root)
    return [Path(entry["path"]) for entry in manifest["files"]] if manifest else []


def _refuse_foreign_files(plan: LauncherPlan, data_root: Path) -> None:
    """Never overwrite a file Hearthside did not write (the user's own launcher, say)."""
    manifest = _read_manifest(data_root)
    ours = {entry["path"] for entry in manifest["files"]} if manifest else set()
    for item in plan.files:
        path = item.path
        if path.exists() and str(path) not in ours and _sha256_of(path) != _sha256(item.content):
            raise HearthsideError(
                f"{path} already exists and was not written by Hearthside.",
                hint="Move it away (or remove it) and run install-launcher again.",
            )


def _make_parents(path: Path) -> list[Path]:
    missing = [parent for parent in reversed(path.parents) if not parent.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    return missing


def _write(item: PlannedFile) -> None:
    temporary = item.path.with_name(item.path.name + ".tmp")
    temporary.write_bytes(item.content)
    temporary.chmod(0o755 if item.executable else 0o644)
    temporary.replace(item.path)


def _run_required(command: Sequence[str], run: Runner) -> None:
    try:
        completed = run(command)
    except (OSError, subprocess.SubprocessError) as exc:
        raise HearthsideError(
            f"Could not run {command[0]}: {exc}.",
            hint="Check that it is installed and on PATH, then try again.",
        ) from exc
    if completed.returncode != 0:
        detail = (completed.stderr or completed.stdout or "").strip().splitlines()[-1:]
        raise HearthsideError(
            f"{command[0]} failed (exit {completed.returncode}).",
            hint=detail[0] if detail else "Try again, or create the shortcut by hand.",
        )


def _run_optional(command: Sequence[str], run: Runner, warnings: list[str]) -> None:
    """Refresh a desktop cache if the tool exists; menus pick entries up without it too."""
    if shutil.which(command[0]) is None:
        return
    try:
        completed = run(command)
    except (OSError, subprocess.SubprocessError) as exc:
        warnings.append(f"{command[0]} did not run: {exc}")
        return
    if completed.returncode != 0:
        warnings.append(f"{command[0]} exited with {completed.returncode}")


def _write_manifest(
    data_root: Path, platform: str, files: Sequence[Path], dirs: Sequence[Path]
) -> None:
    data_root.mkdir(parents=True, exist_ok=True)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "platform": platform,
        "files": [{"path": str(path), "sha256": _sha256_of(path)} for path in files],
        "dirs": [str(folder) for folder in dirs],
    }
    target = manifest_path(data_root)
    temporary = target.with_name(target.name + ".tmp")
    temporary.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    temporary.replace(target)


def _read_manifest(data_root: Path) -> dict | None:
    path = manifest_path(data_root)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise HearthsideError(
            f"The launcher's record of installed files ({path}) is unreadable.",
            hint="Remove the launcher files by hand, then delete that file.",
        ) from exc
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        raise HearthsideError(
            f"The launcher's record of installed files ({path}) is from another version.",
            hint="Remove the launcher files by hand, then delete that file.",
        )
    return manifest


def _why_keep(path: Path, sha256: str) -> str | None:
    if not path.is_file():
        return "already gone"
    if _sha256_of(path) != sha256:
        return "changed since it was installed"
    return None


def _remove_if_empty(folder: Path) -> None:
    # Not empty (someone else's files live there too) or already gone: leave it.
    with contextlib.suppress(OSError):
        folder.rmdir()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_of(path: Path) -> str:
    return _sha256(path.read_bytes())

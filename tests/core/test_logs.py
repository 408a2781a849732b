"""The log file in the data dir, llama.cpp's lines in it, and the words an error becomes:
real files, the real engine."""

from __future__ import annotations

import logging
import os
import stat
from logging.handlers import RotatingFileHandler
from pathlib import Path

import pytest

from hearthside.core.errors import ModelFileError, describe_error
from hearthside.core.logs import log_dir, log_file, setup_logging

pytestmark = pytest.mark.beside


def private(path: Path) -> bool:
    return os.name != "posix" or stat.S_IMODE(path.stat().st_mode) == 0o600


def _our_handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger().handlers if isinstance(h, RotatingFileHandler)]


def test_the_log_file_is_private_in_the_data_dir_and_follows_it(
    hearthside_home: Path, tmp_path: Path
) -> None:
    path = setup_logging()
    assert path == hearthside_home / "logs" / "hearthside.log" == log_file()
    assert setup_logging() == path and len(_our_handlers()) == 1  # idempotent

    logging.getLogger("hearthside.test").warning("first home")
    assert "first home" in path.read_text(encoding="utf-8")
    assert private(path)
    assert stat.S_IMODE(log_dir().stat().st_mode) == 0o700 or os.name != "posix"

    moved = setup_logging(tmp_path / "other-home")
    logging.getLogger("hearthside.test").warning("second home")
    assert len(_our_handlers()) == 1
    assert "second home" in moved.read_text(encoding="utf-8")
    assert "second home" not in path.read_text(encoding="utf-8")


def test_every_file_the_log_rotates_into_is_private(tmp_path: Path) -> None:
    from hearthside.core.logs import _PrivateRotatingFileHandler

    path = tmp_path / "small.log"
    handler = _PrivateRotatingFileHandler(path, maxBytes=200, backupCount=2, encoding="utf-8")
    try:
        for number in range(20):
            handler.emit(logging.makeLogRecord({"msg": f"line {number} " + "x" * 40}))
    finally:
        handler.close()
    files = sorted(tmp_path.glob("small.log*"))
    assert [p.name for p in files] == ["small.log", "small.log.1", "small.log.2"]
    assert all(private(p) for p in files)


def test_a_log_whose_folder_was_removed_stays_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from hearthside.core.logs import _PrivateRotatingFileHandler

    folder = tmp_path / "home" / "logs"
    folder.mkdir(parents=True)
    handler = _PrivateRotatingFileHandler(folder / "x.log", maxBytes=1000, delay=True)
    try:
        shutil.rmtree(tmp_path / "home")  # the data dir deleted while a thread still logs
        handler.emit(logging.makeLogRecord({"msg": "after the folder went"}))
    finally:
        handler.close()
    assert "Logging error" not in capsys.readouterr().err
    assert not folder.exists()  # and it is not made again


def test_llama_cpp_lines_reach_the_log_file_but_not_the_terminal(
    default_model_file: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from hearthside.core.engine.config import EngineConfig
    from hearthside.core.engine.engine import Engine

    path = setup_logging()
    engine = Engine(EngineConfig(model_path=str(default_model_file), n_ctx=512))
    engine.close()

    logged = path.read_text(encoding="utf-8")
    assert "DEBUG hearthside.llama_cpp: llama_model_loader" in logged
    assert "KV buffer size" in logged
    captured = capfd.readouterr()
    assert "llama_model_loader" not in captured.err + captured.out


# ---- words for the user ----------------------------------------------------------------------


def _fail_unexpectedly() -> None:
    raise ValueError("no one foresaw this, marker 9001")


def test_our_errors_are_their_own_words_and_stay_out_of_the_log() -> None:
    error = ModelFileError("This is not a GGUF file.", hint="Choose another file.")

    assert describe_error(error) == "This is not a GGUF file.\nChoose another file."
    assert not log_file().exists() or "GGUF" not in log_file().read_text(encoding="utf-8")


def test_anything_else_is_logged_with_its_traceback_and_named_by_the_log() -> None:
    try:
        _fail_unexpectedly()
    except ValueError as exc:
        text = describe_error(exc)

    assert text == f"Something went wrong (ValueError). The details are in {log_file()}."
    logged = log_file().read_text(encoding="utf-8")
    assert "Traceback (most recent call last)" in logged
    assert "in _fail_unexpectedly" in logged
    assert "ValueError: no one foresaw this, marker 9001" in logged

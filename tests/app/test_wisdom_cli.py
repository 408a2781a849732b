"""`hearthside wisdom export/import/show` move measurements between identical machines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hearthside.app.cli import main
from hearthside.autotune.fingerprint import TuningKey
from hearthside.autotune.wisdom import RunRecord, WisdomDB

pytestmark = pytest.mark.beside

KEY = TuningKey("machine-a", "engine-1", "model-x")


def test_exported_wisdom_imports_into_a_fresh_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with WisdomDB() as db:
        db.record_run(RunRecord(KEY, {"n_threads": 2}, "quick", "ok", decode_tps=40.0))
    exported = tmp_path / "wisdom.json"
    assert main(["wisdom", "export", str(exported)]) == 0
    assert json.loads(exported.read_text())["kind"] == "hearthside-wisdom"

    monkeypatch.setenv("HEARTHSIDE_HOME", str(tmp_path / "other-home"))
    assert main(["wisdom", "import", str(exported)]) == 0
    assert capsys.readouterr().out.startswith("1 runs, ")
    assert main(["wisdom", "show"]) == 0
    assert "runs          1" in capsys.readouterr().out
    with WisdomDB() as db:
        assert db.lookup(KEY, {"n_threads": 2}, "quick") is not None


def test_a_file_that_is_not_wisdom_is_refused_plainly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bogus = tmp_path / "notes.json"
    bogus.write_text('{"hello": 1}')
    assert main(["wisdom", "import", str(bogus)]) == 2
    assert "not a Hearthside wisdom export" in capsys.readouterr().err
    missing = tmp_path / "missing.json"
    assert main(["wisdom", "import", str(missing)]) == 2
    assert "Cannot read" in capsys.readouterr().err

"""The autotune database: runs with rigor and outcome, defaults, efficiency, export/import."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from hearthside.autotune.fingerprint import TuningKey
from hearthside.autotune.wisdom import (
    WISDOM,
    Recipe,
    RunRecord,
    WisdomDB,
    WisdomError,
    config_key,
    default_wisdom_path,
)
from hearthside.core.engine.config import EngineConfig

pytestmark = pytest.mark.beside

KEY = TuningKey("machine-a", "engine-1", "model-x")
FAST = EngineConfig("/models/x.gguf", n_threads=2, flash_attn=True).to_dict()
SLOW = EngineConfig("/models/x.gguf", n_threads=1).to_dict()


@pytest.fixture
def wisdom(tmp_path: Path) -> WisdomDB:
    with WisdomDB(tmp_path / "wisdom.db") as db:
        yield db


def run(
    config: dict,
    rigor: str = "quick",
    outcome: str = "ok",
    decode: float | None = 40.0,
    key: TuningKey = KEY,
) -> RunRecord:
    return RunRecord(
        key=key,
        config=config,
        rigor=rigor,
        outcome=outcome,  # type: ignore[arg-type]
        prefill_tps=300.0 if outcome == "ok" else None,
        decode_tps=decode,
    )


def test_the_database_is_durable_and_versioned(wisdom: WisdomDB) -> None:
    conn = sqlite3.connect(wisdom.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == WISDOM.schema_version
    assert oct(wisdom.path.stat().st_mode & 0o777) == "0o600"


def test_it_lives_in_the_data_dir(hearthside_home: Path) -> None:
    with WisdomDB() as db:
        assert db.path == default_wisdom_path() == hearthside_home / "wisdom.db"


def test_a_recorded_run_comes_back_with_its_figures(wisdom: WisdomDB) -> None:
    stored = wisdom.record_run(run(FAST, decode=41.5))
    assert stored.id is not None and stored.created_at
    (again,) = wisdom.runs(KEY)
    assert again == stored
    assert again.config == {k: v for k, v in FAST.items() if k != "model_path"}


def test_the_model_path_does_not_split_the_same_settings() -> None:
    moved = dict(FAST, model_path="/elsewhere/x.gguf")
    assert config_key(moved) == config_key(FAST)
    assert config_key(SLOW) != config_key(FAST)


def test_a_more_rigorous_result_answers_a_less_rigorous_request(wisdom: WisdomDB) -> None:
    wisdom.record_run(run(FAST, rigor="estimate", decode=30.0))
    assert wisdom.lookup(KEY, FAST, "quick") is None
    thorough = wisdom.record_run(run(FAST, rigor="thorough", decode=44.0))
    wisdom.record_run(run(FAST, rigor="quick", decode=39.0))
    assert wisdom.lookup(KEY, FAST, "quick") == thorough
    assert wisdom.lookup(KEY, FAST, "estimate") == thorough
    assert wisdom.lookup(KEY, SLOW, "estimate") is None


def test_failures_are_remembered_and_not_answers(wisdom: WisdomDB) -> None:
    oom = wisdom.record_run(run(FAST, outcome="oom", decode=None))
    assert wisdom.known_failure(KEY, FAST) == oom
    assert wisdom.lookup(KEY, FAST) is None
    assert wisdom.known_failure(KEY, SLOW) is None
    other_model = TuningKey(KEY.machine, KEY.engine, "model-y")
    assert wisdom.known_failure(other_model, FAST) is None


def test_the_best_run_is_the_fastest_measured_one(wisdom: WisdomDB) -> None:
    wisdom.record_run(run(SLOW, decode=20.0))
    fast = wisdom.record_run(run(FAST, decode=45.0))
    wisdom.record_run(run(FAST, rigor="estimate", decode=90.0))  # a guess is not a measurement
    wisdom.record_run(run(SLOW, outcome="failed", decode=None))
    assert wisdom.best_run(KEY) == fast


def test_a_model_default_is_one_per_machine_engine_and_model(wisdom: WisdomDB) -> None:
    winner = wisdom.record_run(run(FAST))
    wisdom.set_default(KEY, SLOW, goal="balanced")
    wisdom.set_default(KEY, FAST, goal="fastest", run_id=winner.id)
    default = wisdom.default_for(KEY)
    assert default is not None
    assert (default.goal, default.run_id) == ("fastest", winner.id)
    assert EngineConfig.from_dict({**default.config, "model_path": "x"}).flash_attn
    assert wisdom.default_for(TuningKey("machine-b", "engine-1", "model-x")) is None


def test_efficiency_is_a_running_factor_that_keeps_learning(wisdom: WisdomDB) -> None:
    fresh = wisdom.efficiency("m", "e", "CPU", "decode")
    assert (fresh.factor, fresh.samples) == (1.0, 0)
    wisdom.learn_efficiency("m", "e", "CPU", "decode", 0.8)
    learned = wisdom.learn_efficiency("m", "e", "CPU", "decode", 0.6)
    assert learned.factor == pytest.approx(0.7)
    assert learned.samples == 2
    for _ in range(200):
        latest = wisdom.learn_efficiency("m", "e", "CPU", "decode", 0.5)
    assert latest.factor == pytest.approx(0.5, abs=0.01)  # old history fades
    assert wisdom.efficiency("m", "e", "CPU", "prefill").samples == 0
    with pytest.raises(ValueError):
        wisdom.learn_efficiency("m", "e", "CPU", "decode", 0.0)


def test_a_machines_factors_are_listed_and_forgotten_together(wisdom: WisdomDB) -> None:
    wisdom.learn_efficiency("m", "e", "CPU", "decode", 0.8)
    wisdom.learn_efficiency("m", "e", "CUDA0", "prefill", 1.2)
    wisdom.learn_efficiency("m", "other-engine", "CPU", "decode", 0.5)
    wisdom.learn_efficiency("other-machine", "e", "CPU", "decode", 0.4)
    assert [(e.device, e.kind, e.factor) for e in wisdom.efficiencies("m", "e")] == [
        ("CPU", "decode", 0.8),
        ("CUDA0", "prefill", 1.2),
    ]
    wisdom.forget_efficiency("m")
    assert wisdom.efficiencies("m", "e") == [] and wisdom.efficiencies("m", "other-engine") == []
    assert len(wisdom.efficiencies("other-machine", "e")) == 1


def test_the_latest_calibration_wins(wisdom: WisdomDB) -> None:
    wisdom.save_calibration("m", {"created_at": "2026-11-01T00:00:00", "read_gb_s": 20})
    wisdom.save_calibration("m", {"created_at": "2026-11-29T00:00:00", "read_gb_s": 22})
    latest = wisdom.latest_calibration("m")
    assert latest is not None and latest["read_gb_s"] == 22
    assert wisdom.latest_calibration("other") is None


def test_recipes_are_replaced_as_a_set(wisdom: WisdomDB) -> None:
    first = Recipe("v100-f16-kv", {"gpu_arch": ["sm_70"]}, {"type_k": "f16"}, "No bf16 on V100.")
    second = Recipe("gemma-kv", {"architecture": ["gemma3"]}, {"type_k": "f16"}, "Sensitive.")
    assert wisdom.load_recipes([first, second]) == 2
    wisdom.load_recipes([second])
    assert wisdom.recipes() == [second]


def test_export_then_import_on_another_machine_brings_everything(
    wisdom: WisdomDB, tmp_path: Path
) -> None:
    wisdom.note_machine(KEY.machine, {"cpu": "EPYC"})
    winner = wisdom.record_run(run(FAST, rigor="thorough", decode=44.0))
    wisdom.record_run(run(SLOW, outcome="oom", decode=None))
    wisdom.set_default(KEY, FAST, "fastest", run_id=winner.id)
    wisdom.learn_efficiency(KEY.machine, KEY.engine, "CPU", "decode", 0.9)
    wisdom.save_calibration(KEY.machine, {"created_at": "2026-11-29T00:00:00", "x": 1})
    document = json.loads(json.dumps(wisdom.export()))

    with WisdomDB(tmp_path / "other.db") as other:
        added = other.import_(document)
        assert added == {
            "machines": 1,
            "runs": 2,
            "defaults": 1,
            "efficiency": 1,
            "calibrations": 1,
            "type_costs": 0,
            "quality": 0,
        }
        assert other.lookup(KEY, FAST, "thorough") is not None
        assert other.known_failure(KEY, SLOW) is not None
        default = other.default_for(KEY)
        assert default is not None and default.goal == "fastest"
        assert other.efficiency(KEY.machine, KEY.engine, "CPU", "decode").factor == 0.9
        assert other.machine_identity(KEY.machine) == {"cpu": "EPYC"}
        again = other.import_(document)  # importing twice adds nothing
        assert set(again.values()) == {0}


def test_type_costs_travel_with_the_calibration_they_were_fitted_against(
    wisdom: WisdomDB, tmp_path: Path
) -> None:
    calibrated_at = "2026-11-29T00:00:00"
    wisdom.save_calibration(KEY.machine, {"created_at": calibrated_at, "x": 1})
    q4_1 = {"decode_efficiency:Q4_1": 0.42, "decode_row_s:Q4_1": 3e-9}
    wisdom.save_type_costs(KEY.machine, "Q4_1", calibrated_at, q4_1)
    wisdom.save_type_costs(KEY.machine, "IQ4_XS", calibrated_at, {"decode_efficiency:IQ4_XS": 0.3})
    document = json.loads(json.dumps(wisdom.export()))

    with WisdomDB(tmp_path / "other.db") as other:
        added = other.import_(document)
        assert added["type_costs"] == 2 and added["calibrations"] == 1
        latest = other.latest_calibration(KEY.machine)
        assert latest is not None and latest["created_at"] == calibrated_at
        assert other.type_costs(KEY.machine, latest["created_at"]) == wisdom.type_costs(
            KEY.machine, calibrated_at
        )
        assert other.type_costs(KEY.machine, calibrated_at)["decode_row_s:Q4_1"] == 3e-9
        assert other.import_(document)["type_costs"] == 0  # already there: kept, not doubled


def test_a_foreign_or_broken_export_is_refused_whole(wisdom: WisdomDB) -> None:
    with pytest.raises(WisdomError, match="not a Hearthside wisdom export"):
        wisdom.import_({"kind": "something-else"})
    with pytest.raises(WisdomError, match="newer Hearthside"):
        wisdom.import_({"kind": "hearthside-wisdom", "schema": 99})
    good = run(FAST)
    broken = {
        "kind": "hearthside-wisdom",
        "schema": 1,
        "runs": [
            {"key": KEY.to_dict(), "config": {}, "rigor": "quick", "outcome": "ok"},
            {"key": KEY.to_dict(), "config": {}, "rigor": "guess", "outcome": "ok"},
        ],
    }
    with pytest.raises(WisdomError, match="not valid"):
        wisdom.import_(broken)
    assert wisdom.runs(KEY) == []  # the valid first row was rolled back with the rest
    assert good.config_key


def test_a_damaged_file_is_reported_in_plain_words(tmp_path: Path) -> None:
    path = tmp_path / "wisdom.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(WisdomError) as caught:
        WisdomDB(path)
    assert "damaged" in caught.value.message
    assert "wisdom.db" in (caught.value.hint or "")


def test_a_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "wisdom.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {WISDOM.schema_version + 1}")
    conn.close()
    with pytest.raises(WisdomError, match="newer Hearthside"):
        WisdomDB(path)
    version = sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0]
    assert version == WISDOM.schema_version + 1


def test_capacity_audits_are_kept_per_configuration(wisdom: WisdomDB) -> None:
    assert wisdom.latest_audit(KEY, FAST) is None
    wisdom.record_audit(KEY, FAST, {"holds": False, "message": "first"})
    wisdom.record_audit(KEY, FAST, {"holds": True, "message": "second"})
    assert wisdom.latest_audit(KEY, FAST) == {"holds": True, "message": "second"}
    assert wisdom.latest_audit(KEY, SLOW) is None


def test_a_version_1_database_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with WisdomDB(path) as db:
        db.record_run(run(FAST))
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE capacity_audits")
    conn.execute("DROP TABLE type_costs")  # schema 4's
    conn.execute("DROP TABLE quality")  # schema 5's
    conn.execute("ALTER TABLE runs DROP COLUMN repeat_spread")  # schema 7's
    conn.execute("ALTER TABLE runs DROP COLUMN seconds")  # schema 8's
    conn.execute("ALTER TABLE runs DROP COLUMN others_cores")  # schema 9's
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with WisdomDB(path) as db:
        assert len(db.runs(KEY)) == 1
        db.record_audit(KEY, FAST, {"holds": True})
        assert db.latest_audit(KEY, FAST) == {"holds": True}

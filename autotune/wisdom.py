"""The autotune database ("wisdom", after FFTW): every measurement Hearthside makes, keyed by
machine + engine build + model, and what it learned from them.

This module is the only one that touches `wisdom.db`. What it keeps:
- runs: one row per measured (or estimated) configuration, with its rigor (estimate < quick <
  thorough) and outcome; out-of-memory and failed runs are kept so they are never retried;
- defaults: the configuration a model loads with on this machine (the tuner's winner);
- efficiency: per machine and engine, how far measured speed sits from the cost model's
  prediction, as a running factor the planner multiplies in;
- calibrations: the kernels' measurements of this machine;
- recipes: curated priors from `assets/`, always outranked by measurements;
- quality: how far a candidate file + KV-cache type moves a model's next-token distribution
  from its reference file's (`autotune/quality.py`), per evaluation text and context.
Everything exports to and imports from one JSON document, for sharing between identical
machines.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, astuple, replace
from pathlib import Path
from typing import Any, Literal, get_args

# The records live in `records.py` (plain data the plan reads too); their callers import
# them from here as well.
from hearthside.autotune.recipes import shipped_recipes
from hearthside.autotune.records import RIGOR_RANK as RIGOR_RANK
from hearthside.autotune.records import Efficiency as Efficiency
from hearthside.autotune.records import ModelDefault as ModelDefault
from hearthside.autotune.records import Outcome as Outcome
from hearthside.autotune.records import QualityRecord as QualityRecord
from hearthside.autotune.records import Recipe as Recipe
from hearthside.autotune.records import Rigor as Rigor
from hearthside.autotune.records import RunRecord as RunRecord
from hearthside.autotune.records import TuningKey as TuningKey
from hearthside.autotune.records import config_key as config_key
from hearthside.core.database import DatabaseKind, classified_errors, open_database, transaction
from hearthside.core.errors import HearthsideError
from hearthside.core.paths import data_dir

EXPORT_KIND = "hearthside-wisdom"
EXPORT_SCHEMA = 1
# An efficiency factor averages at most this many runs, so it keeps following the machine
# (a driver update, a BIOS setting) instead of freezing on old history.
EFFICIENCY_WINDOW = 20


class WisdomError(HearthsideError):
    """The autotune database cannot be used, or a wisdom file cannot be imported."""


QUALITY_COLUMNS = tuple(QualityRecord.__dataclass_fields__)
# Columns an older export may lack, and what they then hold.
QUALITY_OPTIONAL = {"architecture": ""}


def sync_recipes(db: WisdomDB) -> None:
    """Put the shipped recipes (`recipes.py`) into the autotune DB (replacing older ones)."""
    db.load_recipes(shipped_recipes())


def default_wisdom_path(home: str | None = None) -> Path:
    return data_dir(home) / WISDOM.file_name


def _create_schema_v1(conn: sqlite3.Connection) -> None:
    # One statement at a time: executescript() would commit the migration's transaction.
    for statement in _SCHEMA_V1.split(";"):
        if statement.strip():
            conn.execute(statement)


_SCHEMA_V1 = """
        CREATE TABLE machines (
            fingerprint TEXT PRIMARY KEY,
            identity TEXT NOT NULL,
            first_seen TEXT NOT NULL,
            last_seen TEXT NOT NULL
        );
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            machine TEXT NOT NULL,
            engine TEXT NOT NULL,
            model TEXT NOT NULL,
            config_key TEXT NOT NULL,
            config TEXT NOT NULL,
            rigor TEXT NOT NULL CHECK (rigor IN ('estimate', 'quick', 'thorough')),
            outcome TEXT NOT NULL CHECK (outcome IN ('ok', 'oom', 'failed', 'timeout')),
            prefill_tps REAL,
            decode_tps REAL,
            ttft_s REAL,
            memory TEXT,
            predicted TEXT,
            error TEXT,
            created_at TEXT NOT NULL,
            UNIQUE (machine, engine, model, config_key, rigor, created_at)
        );
        CREATE INDEX runs_by_key ON runs (machine, engine, model, config_key);
        CREATE TABLE defaults (
            machine TEXT NOT NULL,
            engine TEXT NOT NULL,
            model TEXT NOT NULL,
            config TEXT NOT NULL,
            goal TEXT NOT NULL,
            run_id INTEGER REFERENCES runs (id) ON DELETE SET NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (machine, engine, model)
        );
        CREATE TABLE efficiency (
            machine TEXT NOT NULL,
            engine TEXT NOT NULL,
            device TEXT NOT NULL,
            kind TEXT NOT NULL,
            factor REAL NOT NULL CHECK (factor > 0),
            samples INTEGER NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (machine, engine, device, kind)
        );
        CREATE TABLE calibrations (
            id INTEGER PRIMARY KEY,
            machine TEXT NOT NULL,
            report TEXT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (machine, created_at)
        );
        CREATE TABLE recipes (
            id TEXT PRIMARY KEY,
            applies_to TEXT NOT NULL,
            settings TEXT NOT NULL,
            rationale TEXT NOT NULL,
            source TEXT NOT NULL
        );
"""


def _add_capacity_audits(conn: sqlite3.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE capacity_audits (
            id INTEGER PRIMARY KEY,
            machine TEXT NOT NULL,
            engine TEXT NOT NULL,
            model TEXT NOT NULL,
            config_key TEXT NOT NULL,
            holds INTEGER NOT NULL CHECK (holds IN (0, 1)),
            audit TEXT NOT NULL,
            created_at TEXT NOT NULL
        )
        """
    )


def _allow_crashed_runs(conn: sqlite3.Connection) -> None:
    """Schema 3: runs may end `crashed`. SQLite cannot alter a CHECK, so the table is rebuilt;
    dropping the old one nulls the defaults' run ids (ON DELETE SET NULL), so they are kept
    aside and put back."""
    old = _SCHEMA_V1.split("CREATE TABLE runs (")[1].split(");")[0]
    new = old.replace("'failed', 'timeout')", "'failed', 'timeout', 'crashed')")
    conn.execute(f"CREATE TABLE runs_v3 ({new})")
    conn.execute("INSERT INTO runs_v3 SELECT * FROM runs")
    kept = conn.execute("SELECT rowid, run_id FROM defaults WHERE run_id IS NOT NULL").fetchall()
    conn.execute("DROP TABLE runs")
    conn.execute("ALTER TABLE runs_v3 RENAME TO runs")
    conn.execute("CREATE INDEX runs_by_key ON runs (machine, engine, model, config_key)")
    conn.executemany("UPDATE defaults SET run_id = ? WHERE rowid = ?", [(r, i) for i, r in kept])


def _add_type_costs(conn: sqlite3.Connection) -> None:
    """Schema 4: the CPU costs of weight types measured on demand (`autotune/type_costs.py`),
    each fitted against one calibration (its `created_at`) and valid with it only."""
    conn.execute(
        """
        CREATE TABLE type_costs (
            machine TEXT NOT NULL,
            type TEXT NOT NULL,
            calibration TEXT NOT NULL,
            figures TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (machine, type)
        )
        """
    )


def _add_quality(conn: sqlite3.Connection) -> None:
    """Schema 5: measured quality (`autotune/quality.py`). Not keyed by machine: the figures
    belong to the files and the text, so they travel with an export."""
    conn.execute(
        """
        CREATE TABLE quality (
            reference_model TEXT NOT NULL,
            candidate_model TEXT NOT NULL,
            kv_type TEXT NOT NULL,
            text_hash TEXT NOT NULL,
            n_ctx INTEGER NOT NULL,
            candidate TEXT NOT NULL,
            reference TEXT NOT NULL,
            n_tokens INTEGER NOT NULL,
            mean_kld REAL NOT NULL,
            kld_p99 REAL NOT NULL,
            top1_agreement REAL NOT NULL,
            perplexity REAL NOT NULL,
            reference_perplexity REAL NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (reference_model, candidate_model, kv_type, text_hash, n_ctx)
        )
        """
    )


def _add_quality_architecture(conn: sqlite3.Connection) -> None:
    """Schema 6: each quality row names its reference's architecture (the model family)."""
    conn.execute("ALTER TABLE quality ADD COLUMN architecture TEXT NOT NULL DEFAULT ''")


def _add_repeat_spread(conn: sqlite3.Connection) -> None:
    """Schema 7: how far each run's repetitions disagreed (`autotune/busy.py`): a run measured
    while other programs were busy is measured again, not reused."""
    conn.execute("ALTER TABLE runs ADD COLUMN repeat_spread REAL")


def _add_run_seconds(conn: sqlite3.Connection) -> None:
    """Schema 8: how long each run took to measure here (`RunRecord.seconds`), so a tuning
    says beforehand how long it will take (`autotune/tune_wait.py`)."""
    conn.execute("ALTER TABLE runs ADD COLUMN seconds REAL")


def _add_run_others_cores(conn: sqlite3.Connection) -> None:
    """Schema 9: the cores other programs kept busy while each run was measured
    (`RunRecord.others_cores`): a run disturbed by a burst is measured again, not reused."""
    conn.execute("ALTER TABLE runs ADD COLUMN others_cores REAL")


WISDOM = DatabaseKind(
    label="the autotune database (wisdom.db)",
    file_name="wisdom.db",
    schema_version=9,
    migrations={
        0: _create_schema_v1,
        1: _add_capacity_audits,
        2: _allow_crashed_runs,
        3: _add_type_costs,
        4: _add_quality,
        5: _add_quality_architecture,
        6: _add_repeat_spread,
        7: _add_run_seconds,
        8: _add_run_others_cores,
    },
    error=WisdomError,
)


class WisdomDB:
    """The autotune database. Use as a context manager, or call `close()`."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_wisdom_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = open_database(WISDOM, self.path)
        self._conn.row_factory = sqlite3.Row

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> WisdomDB:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- machines ----------------------------------------------------------------------

    def note_machine(self, fingerprint: str, identity: Mapping[str, Any]) -> None:
        now = _now()
        with self._writing():
            self._conn.execute(
                "INSERT INTO machines VALUES (?, ?, ?, ?) ON CONFLICT (fingerprint) "
                "DO UPDATE SET last_seen = excluded.last_seen, identity = excluded.identity",
                (fingerprint, _json(identity), now, now),
            )

    def machine_identity(self, fingerprint: str) -> dict[str, Any] | None:
        row = self._one("SELECT identity FROM machines WHERE fingerprint = ?", (fingerprint,))
        return json.loads(row["identity"]) if row else None

    # ---- runs --------------------------------------------------------------------------

    def record_run(self, run: RunRecord) -> RunRecord:
        """Store `run` (stamped now unless it carries a time); returns it with its id."""
        stamped = replace(run, config=_tunable(run.config), created_at=run.created_at or _now())
        with self._writing():
            cursor = self._conn.execute(
                "INSERT INTO runs (machine, engine, model, config_key, config, rigor, outcome, "
                "prefill_tps, decode_tps, ttft_s, memory, predicted, error, created_at, "
                "repeat_spread, seconds, others_cores) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _run_row(stamped),
            )
        return replace(stamped, id=cursor.lastrowid)

    def runs(self, key: TuningKey, *, outcome: Outcome | None = None) -> list[RunRecord]:
        sql = "SELECT * FROM runs WHERE machine = ? AND engine = ? AND model = ?"
        params: list[Any] = [key.machine, key.engine, key.model]
        if outcome is not None:
            sql += " AND outcome = ?"
            params.append(outcome)
        return [_run_from_row(row) for row in self._all(sql + " ORDER BY id", params)]

    def lookup(
        self, key: TuningKey, config: Mapping[str, Any], rigor: Rigor = "estimate"
    ) -> RunRecord | None:
        """The most rigorous successful run of `config` at least as rigorous as asked (a
        thorough result answers a quick request), newest first among equals."""
        candidates = [
            run
            for run in self._runs_of(key, config)
            if run.outcome == "ok" and RIGOR_RANK[run.rigor] >= RIGOR_RANK[rigor]
        ]
        if not candidates:
            return None
        return max(candidates, key=lambda run: (RIGOR_RANK[run.rigor], run.id or 0))

    def known_failure(self, key: TuningKey, config: Mapping[str, Any]) -> RunRecord | None:
        """A recorded OOM or failure of exactly this configuration: do not try it again."""
        failures = [run for run in self._runs_of(key, config) if run.failed]
        return failures[-1] if failures else None

    def best_run(
        self, key: TuningKey, *, metric: Literal["decode_tps", "prefill_tps"] = "decode_tps"
    ) -> RunRecord | None:
        measured = [
            run
            for run in self.runs(key, outcome="ok")
            if run.rigor != "estimate" and getattr(run, metric) is not None
        ]
        return max(measured, key=lambda run: getattr(run, metric), default=None)

    def _runs_of(self, key: TuningKey, config: Mapping[str, Any]) -> list[RunRecord]:
        rows = self._all(
            "SELECT * FROM runs WHERE machine = ? AND engine = ? AND model = ? AND config_key = ? "
            "ORDER BY id",
            (key.machine, key.engine, key.model, config_key(config)),
        )
        return [_run_from_row(row) for row in rows]

    # ---- context-capacity audits ---------------------------------------------------------

    def record_audit(
        self, key: TuningKey, config: Mapping[str, Any], audit: Mapping[str, Any]
    ) -> None:
        with self._writing():
            self._conn.execute(
                "INSERT INTO capacity_audits (machine, engine, model, config_key, holds, audit, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    key.machine,
                    key.engine,
                    key.model,
                    config_key(config),
                    int(bool(audit.get("holds"))),
                    _json(audit),
                    _now(),
                ),
            )

    def latest_audit(self, key: TuningKey, config: Mapping[str, Any]) -> dict[str, Any] | None:
        row = self._one(
            "SELECT audit FROM capacity_audits WHERE machine = ? AND engine = ? AND model = ? "
            "AND config_key = ? ORDER BY id DESC",
            (key.machine, key.engine, key.model, config_key(config)),
        )
        return json.loads(row["audit"]) if row else None

    # ---- a model's default settings on this machine --------------------------------------

    def set_default(
        self, key: TuningKey, config: Mapping[str, Any], goal: str, run_id: int | None = None
    ) -> None:
        with self._writing():
            self._conn.execute(
                "INSERT INTO defaults VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (machine, engine, model) DO UPDATE SET config = excluded.config, "
                "goal = excluded.goal, run_id = excluded.run_id, updated_at = excluded.updated_at",
                (key.machine, key.engine, key.model, _json(_tunable(config)), goal, run_id, _now()),
            )

    def default_for(self, key: TuningKey) -> ModelDefault | None:
        row = self._one(
            "SELECT * FROM defaults WHERE machine = ? AND engine = ? AND model = ?",
            (key.machine, key.engine, key.model),
        )
        if row is None:
            return None
        return ModelDefault(
            key=key,
            config=json.loads(row["config"]),
            goal=row["goal"],
            run_id=row["run_id"],
            updated_at=row["updated_at"],
        )

    # ---- efficiency factors ------------------------------------------------------------

    def efficiency(self, machine: str, engine: str, device: str, kind: str) -> Efficiency:
        row = self._one(
            "SELECT factor, samples FROM efficiency "
            "WHERE machine = ? AND engine = ? AND device = ? AND kind = ?",
            (machine, engine, device, kind),
        )
        if row is None:
            return Efficiency(machine, engine, device, kind)
        return Efficiency(machine, engine, device, kind, row["factor"], row["samples"])

    def efficiencies(self, machine: str, engine: str) -> list[Efficiency]:
        """Every factor learned on `machine` with `engine`."""
        rows = self._all(
            "SELECT device, kind, factor, samples FROM efficiency "
            "WHERE machine = ? AND engine = ? ORDER BY device, kind",
            (machine, engine),
        )
        return [
            Efficiency(machine, engine, r["device"], r["kind"], r["factor"], r["samples"])
            for r in rows
        ]

    def forget_efficiency(self, machine: str) -> None:
        """Drop what `machine`'s runs taught: they corrected predictions a new calibration
        replaces."""
        with self._writing():
            self._conn.execute("DELETE FROM efficiency WHERE machine = ?", (machine,))

    def learn_efficiency(
        self, machine: str, engine: str, device: str, kind: str, measured_over_predicted: float
    ) -> Efficiency:
        """Fold one measured/predicted ratio into the running factor."""
        if not measured_over_predicted > 0:
            raise ValueError("an efficiency ratio must be positive")
        with self._writing():
            old = self.efficiency(machine, engine, device, kind)
            weight = min(old.samples, EFFICIENCY_WINDOW - 1)
            factor = (old.factor * weight + measured_over_predicted) / (weight + 1)
            new = replace(old, factor=factor, samples=old.samples + 1)
            self._conn.execute(
                "INSERT INTO efficiency VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (machine, engine, device, kind) DO UPDATE SET "
                "factor = excluded.factor, samples = excluded.samples, "
                "updated_at = excluded.updated_at",
                (machine, engine, device, kind, new.factor, new.samples, _now()),
            )
        return new

    # ---- calibrations ------------------------------------------------------------------

    def save_calibration(self, machine: str, report: Mapping[str, Any]) -> None:
        created = str(report.get("created_at") or _now())
        with self._writing():
            self._conn.execute(
                "INSERT OR REPLACE INTO calibrations (machine, report, created_at) "
                "VALUES (?, ?, ?)",
                (machine, _json(report), created),
            )

    def latest_calibration(self, machine: str) -> dict[str, Any] | None:
        row = self._one(
            "SELECT report FROM calibrations WHERE machine = ? ORDER BY created_at DESC, id DESC",
            (machine,),
        )
        return json.loads(row["report"]) if row else None

    # ---- weight types measured on demand ------------------------------------------------

    def save_type_costs(
        self, machine: str, type_name: str, calibration: str, figures: Mapping[str, float]
    ) -> None:
        """Keep one weight type's planner figures ("decode_efficiency:<type>", ...) fitted
        against the calibration created at `calibration`."""
        with self._writing():
            self._conn.execute(
                "INSERT OR REPLACE INTO type_costs VALUES (?, ?, ?, ?, ?)",
                (machine, type_name, calibration, _json(dict(figures)), _now()),
            )

    def type_costs(self, machine: str, calibration: str) -> dict[str, float]:
        """Every type's figures measured on `machine` against that calibration, together."""
        rows = self._all(
            "SELECT figures FROM type_costs WHERE machine = ? AND calibration = ? ORDER BY type",
            (machine, calibration),
        )
        return {key: value for row in rows for key, value in json.loads(row["figures"]).items()}

    # ---- measured quality ----------------------------------------------------------------

    def save_quality(self, record: QualityRecord) -> QualityRecord:
        """Keep `record` (stamped now unless it carries a time), replacing an older one."""
        stamped = replace(record, created_at=record.created_at or _now())
        with self._writing():
            self._conn.execute(
                f"INSERT OR REPLACE INTO quality ({', '.join(QUALITY_COLUMNS)}) "
                f"VALUES ({', '.join('?' for _ in QUALITY_COLUMNS)})",
                astuple(stamped),
            )
        return stamped

    def quality(
        self, reference_model: str, candidate_model: str, kv_type: str, text_hash: str, n_ctx: int
    ) -> QualityRecord | None:
        row = self._one(
            "SELECT * FROM quality WHERE reference_model = ? AND candidate_model = ? "
            "AND kv_type = ? AND text_hash = ? AND n_ctx = ?",
            (reference_model, candidate_model, kv_type, text_hash, n_ctx),
        )
        return QualityRecord(**dict(row)) if row else None

    def qualities(self, reference_model: str) -> list[QualityRecord]:
        """Every candidate measured against `reference_model`, lowest mean KLD first."""
        rows = self._all(
            "SELECT * FROM quality WHERE reference_model = ? ORDER BY mean_kld, candidate",
            (reference_model,),
        )
        return [QualityRecord(**dict(row)) for row in rows]

    def kv_measurements(self, architecture: str) -> list[QualityRecord]:
        """Every KV-cache type measured on a file of `architecture` against that file itself
        with an f16 KV cache (what a KV type alone does to the answers), most tokens first."""
        rows = self._all(
            "SELECT * FROM quality WHERE architecture = ? AND architecture != '' "
            "AND candidate_model = reference_model AND kv_type != 'f16' "
            "ORDER BY n_tokens DESC, created_at DESC",
            (architecture,),
        )
        return [QualityRecord(**dict(row)) for row in rows]

    def note_quality_architecture(self, reference_model: str, architecture: str) -> None:
        """Name the family of the rows measured against `reference_model` before rows had
        one (schema 6), now that a caller has read it from the file."""
        if not architecture:
            return
        with self._writing():
            self._conn.execute(
                "UPDATE quality SET architecture = ? WHERE reference_model = ? "
                "AND architecture = ''",
                (architecture, reference_model),
            )

    # ---- recipes -----------------------------------------------------------------------

    def load_recipes(self, recipes: Iterable[Recipe]) -> int:
        """Replace the curated recipes with `recipes` (measurements are untouched)."""
        rows = [
            (r.id, _json(r.applies_to), _json(r.settings), r.rationale, r.source) for r in recipes
        ]
        with self._writing():
            self._conn.execute("DELETE FROM recipes")
            self._conn.executemany("INSERT INTO recipes VALUES (?, ?, ?, ?, ?)", rows)
        return len(rows)

    def recipes(self) -> list[Recipe]:
        return [
            Recipe(
                id=row["id"],
                applies_to=json.loads(row["applies_to"]),
                settings=json.loads(row["settings"]),
                rationale=row["rationale"],
                source=row["source"],
            )
            for row in self._all("SELECT * FROM recipes ORDER BY id", ())
        ]

    # ---- sharing -----------------------------------------------------------------------

    def export(self) -> dict[str, Any]:
        """Everything measured, as one JSON-ready document (recipes ship with Hearthside)."""
        return {
            "kind": EXPORT_KIND,
            "schema": EXPORT_SCHEMA,
            "exported_at": _now(),
            "machines": [dict(row) for row in self._all("SELECT * FROM machines", ())],
            "runs": [
                _run_to_json(_run_from_row(row)) for row in self._all("SELECT * FROM runs", ())
            ],
            "defaults": [dict(row) for row in self._all("SELECT * FROM defaults", ())],
            "efficiency": [dict(row) for row in self._all("SELECT * FROM efficiency", ())],
            "calibrations": [dict(row) for row in self._all("SELECT * FROM calibrations", ())],
            "type_costs": [dict(row) for row in self._all("SELECT * FROM type_costs", ())],
            "quality": [dict(row) for row in self._all("SELECT * FROM quality", ())],
        }

    def import_(self, document: Mapping[str, Any]) -> dict[str, int]:
        """Merge an exported document; rows already present are skipped. Returns counts added."""
        _check_export(document)
        added = {"runs": 0, "defaults": 0, "efficiency": 0, "calibrations": 0, "machines": 0}
        added["type_costs"] = 0
        added["quality"] = 0
        try:
            with self._writing():
                added["machines"] = self._insert_new("machines", document.get("machines", []))
                for item in document.get("runs", []):
                    row = _run_row(_run_from_json(item))
                    added["runs"] += self._conn.execute(
                        "INSERT OR IGNORE INTO runs (machine, engine, model, config_key, config, "
                        "rigor, outcome, prefill_tps, decode_tps, ttft_s, memory, predicted, "
                        "error, created_at, repeat_spread, seconds, others_cores) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        row,
                    ).rowcount
                defaults = [{**item, "run_id": None} for item in document.get("defaults", [])]
                added["defaults"] = self._insert_new("defaults", defaults)
                added["efficiency"] = self._insert_new("efficiency", document.get("efficiency", []))
                calibrations = [
                    {key: value for key, value in item.items() if key != "id"}
                    for item in document.get("calibrations", [])
                ]
                added["calibrations"] = self._insert_new("calibrations", calibrations)
                # each names the calibration it was fitted against by its created_at, which
                # the import keeps, so imported costs stay valid with imported calibrations
                added["type_costs"] = self._insert_new("type_costs", document.get("type_costs", []))
                quality = [_quality_item(item) for item in document.get("quality", [])]
                added["quality"] = self._insert_new("quality", quality)
        except (KeyError, TypeError, ValueError, sqlite3.IntegrityError) as exc:
            raise WisdomError(
                f"The wisdom file is not valid ({type(exc).__name__}: {exc}); "
                "nothing was imported.",
                hint="Export it again with `hearthside wisdom export` on the other machine.",
            ) from exc
        return added

    def _insert_new(self, table: str, items: Iterable[Mapping[str, Any]]) -> int:
        count = 0
        for item in items:
            names = ", ".join(item)
            marks = ", ".join("?" for _ in item)
            count += self._conn.execute(
                f"INSERT OR IGNORE INTO {table} ({names}) VALUES ({marks})", tuple(item.values())
            ).rowcount
        return count

    # ---- plumbing ----------------------------------------------------------------------

    @contextmanager
    def _writing(self) -> Iterator[None]:
        with classified_errors(WISDOM), transaction(self._conn):
            yield

    def _one(self, sql: str, params: Iterable[Any]) -> sqlite3.Row | None:
        with classified_errors(WISDOM):
            row: sqlite3.Row | None = self._conn.execute(sql, tuple(params)).fetchone()
        return row

    def _all(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with classified_errors(WISDOM):
            return list(self._conn.execute(sql, tuple(params)).fetchall())


def _check_export(document: Mapping[str, Any]) -> None:
    if not isinstance(document, Mapping) or document.get("kind") != EXPORT_KIND:
        raise WisdomError(
            "This file is not a Hearthside wisdom export.",
            hint="Choose a file made by `hearthside wisdom export`.",
        )
    if document.get("schema", 0) > EXPORT_SCHEMA:
        raise WisdomError(
            "This wisdom file comes from a newer Hearthside.", hint="Update Hearthside first."
        )


def _quality_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """An imported quality row through its record type: known columns only, all present but
    those an older export lacks (`QUALITY_OPTIONAL`)."""
    values = {**QUALITY_OPTIONAL, **{k: v for k, v in item.items() if k in QUALITY_OPTIONAL}}
    values.update({name: item[name] for name in QUALITY_COLUMNS if name not in QUALITY_OPTIONAL})
    return asdict(QualityRecord(**values))


def _tunable(config: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in config.items() if name != "model_path"}


def _run_row(run: RunRecord) -> tuple[Any, ...]:
    if run.rigor not in RIGOR_RANK or run.outcome not in get_args(Outcome):
        raise ValueError(f"unknown rigor {run.rigor!r} or outcome {run.outcome!r}")
    return (
        run.key.machine,
        run.key.engine,
        run.key.model,
        run.config_key,
        _json(_tunable(run.config)),
        run.rigor,
        run.outcome,
        run.prefill_tps,
        run.decode_tps,
        run.ttft_s,
        _json(run.memory) if run.memory is not None else None,
        _json(run.predicted) if run.predicted is not None else None,
        run.error,
        run.created_at,
        run.repeat_spread,
        run.seconds,
        run.others_cores,
    )


def _run_from_row(row: sqlite3.Row) -> RunRecord:
    return RunRecord(
        key=TuningKey(row["machine"], row["engine"], row["model"]),
        config=json.loads(row["config"]),
        rigor=row["rigor"],
        outcome=row["outcome"],
        prefill_tps=row["prefill_tps"],
        decode_tps=row["decode_tps"],
        ttft_s=row["ttft_s"],
        memory=json.loads(row["memory"]) if row["memory"] else None,
        predicted=json.loads(row["predicted"]) if row["predicted"] else None,
        error=row["error"],
        created_at=row["created_at"],
        id=row["id"],
        repeat_spread=row["repeat_spread"],
        seconds=row["seconds"],
        others_cores=row["others_cores"],
    )


def _run_to_json(run: RunRecord) -> dict[str, Any]:
    data = asdict(run)
    data.pop("id")
    return data


def _run_from_json(data: Mapping[str, Any]) -> RunRecord:
    values = dict(data)
    values["key"] = TuningKey(**values["key"])
    values.pop("id", None)
    return RunRecord(**values)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")

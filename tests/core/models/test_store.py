"""The model registry, on real SQLite files and real (tiny, synthetic) GGUF files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from hearthside.core.database import classified_errors
from hearthside.core.errors import EngineError, ModelFileError, ModelStoreError
from hearthside.core.models import store as store_module
from hearthside.core.models.child_check import (
    EXIT_ENGINE_MISSING,
    EXIT_LOAD_REFUSED,
    check_loads_in_child,
)
from hearthside.core.models.gguf_validator import GGUFValidationError
from hearthside.core.models.store import (
    STALE_PART_AGE_S,
    ModelStore,
    is_valid_model_id,
    resolve_model_path,
    slugify_model_id,
)
from hearthside.core.paths import data_dir
from tests.gguf_samples import write_tiny_gguf
from tests.hub_server import write_llama_gguf

# --- helpers ---------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextmanager
def raw_registry(db_path: Path) -> Iterator[sqlite3.Connection]:
    """A second, plain connection to the registry, committed and closed on exit."""
    conn = sqlite3.connect(db_path)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def files_in(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir())


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture
def store() -> Iterator[ModelStore]:
    with ModelStore(data_dir()) as opened:
        yield opened


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "user files"
    directory.mkdir()
    return directory


@pytest.fixture
def tiny(user_dir: Path) -> Path:
    return write_tiny_gguf(user_dir / "Tiny Model.Q8.gguf")


def add_quickly(store: ModelStore, path: Path, **kwargs: Any) -> store_module.ModelRecord:
    """Add without the native child check, for tests where native loading is not the point
    (the synthetic files carry no vocabulary, so llama.cpp would refuse them anyway)."""
    return store.add(path, check_native=False, **kwargs)


# --- add / list / get / remove ---------------------------------------------------------------


def test_add_copies_hashes_and_registers(store: ModelStore, tiny: Path) -> None:
    record = add_quickly(store, tiny)

    assert record.id == "tiny-model.q8"
    assert record.name == "Tiny Test 0"
    assert record.path == store.models_dir / "tiny-model.q8.gguf"
    assert record.path.read_bytes() == tiny.read_bytes()
    assert record.size_bytes == tiny.stat().st_size
    assert record.sha256 == sha256_of(tiny)
    assert (record.architecture, record.quant) == ("llama", "F32")
    assert record.parameter_count == 8 * 16 + 16
    assert (record.source, record.licence, record.is_default, record.linked) == (
        "file",
        None,
        False,
        False,
    )
    assert record.added_at.endswith("+00:00")
    assert tiny.exists()  # the user's file is left alone
    assert files_in(store.models_dir) == ["tiny-model.q8.gguf"]


def test_registry_round_trips_across_opens(store: ModelStore, tiny: Path) -> None:
    record = add_quickly(store, tiny, name="My tiny model")
    store.close()

    with ModelStore(data_dir()) as reopened:
        assert reopened.list() == [record]
        assert reopened.get(record.id) == record
        assert reopened.find_by_sha256(record.sha256.upper()) == record
    assert json.loads(json.dumps(record.to_dict()))["path"] == str(record.path)
    assert record.name == "My tiny model"


def test_progress_reports_every_byte_copied(store: ModelStore, tiny: Path) -> None:
    reports: list[tuple[int, int]] = []
    add_quickly(store, tiny, progress=lambda done, total: reports.append((done, total)))
    size = tiny.stat().st_size
    assert reports[-1] == (size, size)


def test_remove_deletes_the_copy_only_when_asked(store: ModelStore, user_dir: Path) -> None:
    first = add_quickly(store, write_tiny_gguf(user_dir / "a.gguf", seed=1))
    second = add_quickly(store, write_tiny_gguf(user_dir / "b.gguf", seed=2))

    store.remove(first.id)
    store.remove(second.id, delete_file=False)

    assert store.list() == []
    assert not first.path.exists()
    assert second.path.exists()
    with pytest.raises(ModelStoreError, match="No model called 'a'"):
        store.get("a")


def test_ids_are_unique_with_numbered_suffixes(store: ModelStore, user_dir: Path) -> None:
    first = add_quickly(store, write_tiny_gguf(user_dir / "one" / "model.gguf", seed=1))
    second = add_quickly(store, write_tiny_gguf(user_dir / "two" / "model.gguf", seed=2))
    third = add_quickly(store, write_tiny_gguf(user_dir / "three" / "model.gguf", seed=3))
    assert [first.id, second.id, third.id] == ["model", "model-2", "model-3"]
    assert third.path.name == "model-3.gguf"


def test_the_word_default_is_never_an_id(store: ModelStore, user_dir: Path) -> None:
    record = add_quickly(store, write_tiny_gguf(user_dir / "Default.gguf"))
    assert record.id == "default-2"


# --- the default -----------------------------------------------------------------------------


def test_default_round_trip_and_the_word_default(store: ModelStore, user_dir: Path) -> None:
    first = add_quickly(store, write_tiny_gguf(user_dir / "first.gguf", seed=1))
    second = add_quickly(store, write_tiny_gguf(user_dir / "second.gguf", seed=2))
    assert store.default() is None
    with pytest.raises(ModelStoreError, match="No default model") as raised:
        store.resolve("default")
    assert "install-default" in (raised.value.hint or "")

    store.set_default(first.id)
    store.set_default(second.id)

    assert store.default() == store.get(second.id)
    assert store.resolve("default").id == second.id
    assert [record.is_default for record in store.list()] == [False, True]
    assert store.resolve(first.id).id == first.id


def test_resolve_unknown_id_says_how_to_list(store: ModelStore) -> None:
    with pytest.raises(ModelStoreError) as raised:
        store.resolve("nope")
    assert raised.value.user_text() == (
        "No model called 'nope'.\nRun `hearthside models list` to see what is installed."
    )


# --- refusals: nothing is copied, nothing is registered ----------------------------------------


def test_duplicate_sha256_is_refused_naming_the_existing_id(
    store: ModelStore, tiny: Path, user_dir: Path
) -> None:
    original = add_quickly(store, tiny)
    twin = user_dir / "renamed copy.gguf"
    shutil.copyfile(tiny, twin)

    with pytest.raises(ModelStoreError, match=f"already installed as '{original.id}'"):
        add_quickly(store, twin)
    with pytest.raises(ModelStoreError, match="already installed"):
        add_quickly(store, twin, link=True)
    assert store.list() == [original]
    assert files_in(store.models_dir) == [original.path.name]


def test_the_same_path_twice_is_refused(store: ModelStore, tiny: Path) -> None:
    record = add_quickly(store, tiny, link=True)
    with pytest.raises(ModelStoreError, match=f"already registered as '{record.id}'"):
        add_quickly(store, tiny, link=True)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: b"GGUF" + b"\xff" * 60, id="garbage-after-magic"),
        pytest.param(lambda data: data[: len(data) - 40], id="tensor-data-past-eof"),
        pytest.param(lambda data: b"not a model at all", id="not-gguf"),
    ],
)
def test_a_corrupt_file_is_refused_before_anything_is_copied(
    store: ModelStore, tiny: Path, damage: object
) -> None:
    tiny.write_bytes(damage(tiny.read_bytes()))  # type: ignore[operator]
    with pytest.raises(GGUFValidationError):
        add_quickly(store, tiny)
    assert files_in(store.models_dir) == []
    assert store.list() == []


def test_wrong_paths_are_clear_errors(store: ModelStore, user_dir: Path) -> None:
    with pytest.raises(ModelFileError, match="There is no file at"):
        add_quickly(store, user_dir / "missing.gguf")
    with pytest.raises(ModelFileError, match="is not a file"):
        add_quickly(store, user_dir)
    assert store.list() == []


def test_too_little_free_space_is_refused_before_copying(
    store: ModelStore, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_usage = shutil.disk_usage(store.models_dir)
    monkeypatch.setattr(
        shutil, "disk_usage", lambda path: real_usage._replace(free=tiny.stat().st_size)
    )
    with pytest.raises(ModelStoreError, match="Not enough free disk space") as raised:
        add_quickly(store, tiny)
    assert "--link" in (raised.value.hint or "")
    assert files_in(store.models_dir) == []
    assert store.list() == []
    # Linking copies nothing, so it needs no space.
    assert add_quickly(store, tiny, link=True).linked


# --- link mode and files already in the models dir ---------------------------------------------


def test_link_mode_registers_in_place_and_never_deletes_the_users_file(
    store: ModelStore, tiny: Path
) -> None:
    record = add_quickly(store, tiny, link=True)

    assert record.linked
    assert record.path == tiny.resolve()
    assert record.sha256 == sha256_of(tiny)
    assert files_in(store.models_dir) == []
    assert not store.owns_file(record)

    store.remove(record.id, delete_file=True)
    assert tiny.exists()
    assert store.list() == []


def test_a_file_already_in_the_models_dir_is_registered_in_place(store: ModelStore) -> None:
    dropped = write_tiny_gguf(store.models_dir / "Dropped In.gguf")
    record = add_quickly(store, dropped)

    assert (record.id, record.path, record.linked) == ("dropped-in", dropped, False)
    assert files_in(store.models_dir) == ["Dropped In.gguf"]
    store.remove(record.id)
    assert not dropped.exists()


# --- leftovers, permissions, schema ----------------------------------------------------------


def test_a_stale_part_file_is_cleaned_on_open_but_a_fresh_one_is_kept() -> None:
    models = data_dir() / "models"
    models.mkdir(parents=True)
    stale = models / "crashed.gguf.part"
    fresh = models / "being-copied-by-another-process.gguf.part"
    stale.write_bytes(b"half a model")
    fresh.write_bytes(b"still arriving")
    old = time.time() - STALE_PART_AGE_S - 60
    os.utime(stale, (old, old))

    with ModelStore(data_dir()) as opened:
        assert files_in(opened.models_dir) == [fresh.name]


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_data_dir_db_and_model_files_are_private(store: ModelStore, tiny: Path) -> None:
    record = add_quickly(store, tiny)
    store.set_default(record.id)  # a write, so the WAL file exists

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(store.root) == 0o700
    assert mode(store.models_dir) == 0o700
    assert mode(store.db_path) == 0o600
    assert mode(store.db_path.with_name("models.db-wal")) == 0o600
    assert mode(record.path) == 0o600


def test_registry_uses_wal_and_full_sync(store: ModelStore) -> None:
    with raw_registry(store.db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == store_module.SCHEMA_VERSION


def test_a_registry_from_a_newer_hearthside_is_refused(store: ModelStore) -> None:
    store.close()
    with raw_registry(store.db_path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(ModelStoreError, match=r"newer Hearthside \(schema 99") as raised:
        ModelStore(data_dir())
    assert "Update Hearthside" in (raised.value.hint or "")


def test_a_damaged_registry_is_a_clear_error() -> None:
    db_path = data_dir() / "models.db"
    db_path.write_bytes(b"this is not an SQLite database, just junk " * 200)
    with pytest.raises(ModelStoreError, match="damaged") as raised:
        ModelStore(data_dir())
    assert "Move models.db" in (raised.value.hint or "")


def test_a_locked_registry_is_a_clear_error(store: ModelStore, tiny: Path) -> None:
    record = add_quickly(store, tiny)
    other = sqlite3.connect(store.db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with (
            ModelStore(data_dir(), busy_timeout_s=0.1) as impatient,
            pytest.raises(ModelStoreError, match="busy in another Hearthside"),
        ):
            impatient.set_default(record.id)
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_read_only_is_classified_and_our_own_bugs_are_not(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "scratch.db")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("PRAGMA query_only = ON")
    with (
        pytest.raises(ModelStoreError, match="read-only"),
        classified_errors(store_module.REGISTRY),
    ):
        conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.OperationalError), classified_errors(store_module.REGISTRY):
        conn.execute("SELEKT nonsense")
    conn.close()


# --- ids and paths that try to escape --------------------------------------------------------


@pytest.mark.parametrize(
    ("stem", "expected"),
    [
        ("Llama-3.2-3B-Instruct-Q4_K_M", "llama-3.2-3b-instruct-q4_k_m"),
        ("My Model (final)", "my-model-final"),
        ("..", "model"),
        ("../../etc/passwd", "etc-passwd"),
        ("a/b\\c", "a-b-c"),
        ("...hidden..name...", "hidden.name"),
        ("модель", "model"),
        ("x" * 200, "x" * 64),
    ],
)
def test_slugs_are_safe_ids(stem: str, expected: str) -> None:
    slug = slugify_model_id(stem)
    assert slug == expected
    assert is_valid_model_id(slug)


@pytest.mark.parametrize("bad", ["../x", "a/b", "a\\b", "..", ".", "x..y", "/etc/passwd", "", "A"])
def test_traversal_attempts_name_no_model(store: ModelStore, tiny: Path, bad: str) -> None:
    add_quickly(store, tiny)
    assert not is_valid_model_id(bad)
    for operation in (store.get, store.remove, store.set_default):
        with pytest.raises(ModelStoreError, match="No model called"):
            operation(bad)
    assert len(store.list()) == 1


def test_a_hand_edited_entry_pointing_outside_is_refused(
    store: ModelStore, tiny: Path, user_dir: Path
) -> None:
    record = add_quickly(store, tiny)
    victim = write_tiny_gguf(user_dir / "victim.gguf", seed=7)
    escape = os.path.relpath(victim, store.models_dir)
    with raw_registry(store.db_path) as conn:
        conn.execute("UPDATE models SET file = ? WHERE id = ?", [escape, record.id])

    with pytest.raises(ModelStoreError, match="points outside"):
        store.remove(record.id)
    assert victim.exists()


# --- resolve_model_path ----------------------------------------------------------------------


def test_resolve_model_path_accepts_default_ids_and_unregistered_files(
    store: ModelStore, user_dir: Path
) -> None:
    record = add_quickly(store, write_tiny_gguf(user_dir / "registered.gguf", seed=1))
    store.set_default(record.id)
    loose = write_tiny_gguf(user_dir / "loose.gguf", seed=2, loadable=True)

    assert resolve_model_path(store, "default") == record.path
    assert resolve_model_path(store, record.id) == record.path
    assert resolve_model_path(store, str(loose)) == loose
    assert len(store.list()) == 1  # resolving a path registers nothing


def test_resolve_model_path_loads_an_unregistered_file_in_a_child_first(
    store: ModelStore, user_dir: Path
) -> None:
    refused_by_llama_cpp = write_tiny_gguf(user_dir / "no-hparams.gguf", seed=3)
    with pytest.raises(ModelFileError, match="llama.cpp could not load"):
        resolve_model_path(store, str(refused_by_llama_cpp))


def test_resolve_model_path_wrong_refs(store: ModelStore, user_dir: Path) -> None:
    junk = user_dir / "junk.gguf"
    junk.write_bytes(b"GGUF nonsense")
    with pytest.raises(GGUFValidationError):
        resolve_model_path(store, str(junk))
    with pytest.raises(ModelFileError, match="There is no model file at"):
        resolve_model_path(store, str(user_dir / "missing.gguf"))
    with pytest.raises(ModelStoreError, match="No model called 'missing-id'"):
        resolve_model_path(store, "missing-id")
    with pytest.raises(ModelStoreError, match="No default model"):
        resolve_model_path(store, "default")


def test_resolve_model_path_reports_a_registered_file_that_vanished(
    store: ModelStore, tiny: Path
) -> None:
    record = add_quickly(store, tiny, link=True)
    tiny.unlink()
    with pytest.raises(ModelFileError, match=f"file for model '{record.id}' is missing"):
        resolve_model_path(store, record.id)


# --- the native check in a child process -------------------------------------------------------


def test_child_check_passes_for_the_real_default_model(default_model_file: Path) -> None:
    check_loads_in_child(default_model_file)


def test_child_check_passes_for_a_tiny_model_with_a_vocabulary(user_dir: Path) -> None:
    check_loads_in_child(write_tiny_gguf(user_dir / "loadable.gguf", loadable=True))


def test_add_refuses_a_file_the_validator_passes_but_llama_cpp_cannot_read(
    store: ModelStore, tiny: Path
) -> None:
    # Structurally sound GGUF, but no llama hyperparameters or vocabulary: llama.cpp refuses.
    with pytest.raises(ModelFileError, match="llama.cpp could not load this model file"):
        store.add(tiny)
    assert files_in(store.models_dir) == []
    assert store.list() == []


def test_add_runs_the_native_check_and_accepts_a_readable_file(
    store: ModelStore, user_dir: Path
) -> None:
    record = store.add(write_tiny_gguf(user_dir / "readable.gguf", loadable=True))
    assert record.path.exists()


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_a_crashing_child_is_a_model_file_error(tiny: Path) -> None:
    crash = _child(f"import os; os.kill(os.getpid(), {int(signal.SIGSEGV)})")
    with pytest.raises(ModelFileError, match=r"crashed with signal 11 \(SIGSEGV\)"):
        check_loads_in_child(tiny, command=crash)


def test_a_hanging_child_is_killed_and_reported(tiny: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ModelFileError, match="did not finish loading this model file within"):
        check_loads_in_child(tiny, timeout_s=0.5, command=_child("import time; time.sleep(30)"))
    assert time.monotonic() - started < 10


def test_child_exit_codes_map_to_plain_errors(tiny: Path) -> None:
    with pytest.raises(ModelFileError, match="refused to load it"):
        check_loads_in_child(tiny, command=_child(f"raise SystemExit({EXIT_LOAD_REFUSED})"))
    with pytest.raises(ModelFileError, match="exited with code 9"):
        check_loads_in_child(tiny, command=_child("raise SystemExit(9)"))
    with pytest.raises(EngineError, match="llama-cpp-python failed to load"):
        check_loads_in_child(tiny, command=_child(f"raise SystemExit({EXIT_ENGINE_MISSING})"))


def test_the_child_gets_the_path_as_its_last_argument(tiny: Path) -> None:
    expects_path = _child(f"import sys; raise SystemExit(0 if sys.argv[1] == {str(tiny)!r} else 9)")
    check_loads_in_child(tiny, command=expects_path)


# --- schema 2: variants, split models, installers ----------------------------------------------


def test_a_schema_1_registry_is_migrated_and_keeps_its_models(tiny: Path) -> None:
    db_path = data_dir() / "models.db"
    legacy = sqlite_utils.Database(sqlite3.connect(db_path, isolation_level=None))
    store_module._create_schema_v1(legacy)
    legacy.execute("PRAGMA user_version = 1")
    legacy.table("models").insert(
        {
            "id": "old-model",
            "name": "Old model",
            "file": str(tiny.resolve()),
            "linked": 1,
            "size_bytes": tiny.stat().st_size,
            "sha256": sha256_of(tiny),
            "added_at": "2025-01-01T00:00:00+00:00",
            "source": "file",
            "is_default": 1,
        }
    )
    legacy.conn.close()

    with ModelStore(data_dir()) as migrated:
        [record] = migrated.list()
        assert (record.id, record.is_default, record.path) == ("old-model", True, tiny.resolve())
        assert (record.variant_of, record.part_count) == (None, 1)
    with raw_registry(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == store_module.SCHEMA_VERSION


def test_an_installed_split_model_is_one_model_and_removing_it_deletes_every_part(
    store: ModelStore,
) -> None:
    parts = write_llama_gguf(
        store.models_dir / "split-model.gguf", hidden=128, feed_forward=256, split_max_tensors=6
    )
    assert [p.name for p in parts] == [
        "split-model-00001-of-00002.gguf",
        "split-model-00002-of-00002.gguf",
    ]
    assert store.unused_model_id("split-model") == "split-model-2"  # its files hold the name

    record = store.register_installed(
        parts[0],
        model_id="split-model",
        source="hub:acme/m/split-model-00001-of-00002.gguf",
        part_count=2,
        variant_of=None,
        check_native=False,
    )

    assert record.size_bytes == sum(p.stat().st_size for p in parts)
    assert record.sha256 == sha256_of(parts[0])
    assert store.files_of(record) == parts
    assert store.find_by_source("hub:acme/m/split-model-00001-of-00002.gguf") == record
    store.remove(record.id)
    assert files_in(store.models_dir) == []


def test_register_installed_refuses_what_an_installer_must_not_do(
    store: ModelStore, tiny: Path
) -> None:
    inside = store.models_dir / "inside.gguf"
    shutil.copy(tiny, inside)
    with pytest.raises(ValueError, match="unknown model source"):
        store.register_installed(inside, model_id="inside", source="http://x", check_native=False)
    with pytest.raises(ValueError, match="not in the models dir"):
        store.register_installed(tiny, model_id="outside", source="file", check_native=False)
    with pytest.raises(ValueError, match="not named like part 1 of 2"):
        store.register_installed(
            inside, model_id="inside", source="file", part_count=2, check_native=False
        )
    with pytest.raises(ValueError, match="not a model id"):
        store.register_installed(inside, model_id="default", source="file", check_native=False)

    variant = store.register_installed(
        inside,
        model_id="inside-q8_0",
        source="quantized:base",
        variant_of="base",
        check_native=False,
    )
    assert store.variants_of("base") == [variant]
    assert variant.to_dict()["variant_of"] == "base"

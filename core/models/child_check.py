"""The first native load of a new model file happens in a child process.

The pure-Python validator catches the malformed files we know about, but llama.cpp's GGUF
parser has had memory-safety bugs the validator cannot foresee. Reading the file once in a
throwaway process means such a bug costs a failed check, not a crashed app (SECURITY.md).

Run as `python -m hearthside.core.models.child_check PATH`: exits 0 when llama.cpp reads the
file's header and vocabulary, EXIT_LOAD_REFUSED when it refuses the file, EXIT_ENGINE_MISSING
when llama-cpp-python itself cannot be imported.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from hearthside.core.errors import EngineError, ModelFileError

CHILD_MODULE = "hearthside.core.models.child_check"
DEFAULT_TIMEOUT_S = 60.0

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_LOAD_REFUSED = 3
EXIT_ENGINE_MISSING = 4

_NOT_ADDED_HINT = (
    "The file may be damaged, or made for a newer llama.cpp than this Hearthside ships. "
    "Hearthside did not add it."
)

log = logging.getLogger(__name__)


def check_loads_in_child(
    path: str | os.PathLike[str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    command: Sequence[str] | None = None,
) -> None:
    """Raise ModelFileError unless llama.cpp reads `path` cleanly in a separate process.

    `command` replaces `python -m hearthside.core.models.child_check`; the path is appended to
    it. Tests use it to stand in a child that crashes or hangs.
    """
    argv = [*(command if command is not None else _child_command()), os.fspath(path)]
    try:
        result = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ModelFileError(
            f"llama.cpp did not finish reading this model file within {timeout_s:g} s.",
            hint=_NOT_ADDED_HINT,
        ) from None
    except OSError as exc:
        raise EngineError(
            "Hearthside could not start a helper process to check this model file.",
            hint=f"The system said: {exc.strerror or exc}.",
        ) from exc
    if result.returncode == EXIT_OK:
        return
    log.debug("child check of %s failed: %s", path, result.stderr[-2000:])
    raise _failure_error(result.returncode)


def _child_command() -> list[str]:
    return [sys.executable, "-m", CHILD_MODULE]


def _failure_error(returncode: int) -> ModelFileError | EngineError:
    if returncode == EXIT_ENGINE_MISSING:
        return EngineError(
            "Hearthside could not check this model file: llama-cpp-python failed to load.",
            hint="Reinstall Hearthside, or run `hearthside probe` to see what the engine reports.",
        )
    return ModelFileError(
        f"llama.cpp could not read this model file ({describe_exit(returncode)}).",
        hint=_NOT_ADDED_HINT,
    )


def describe_exit(returncode: int) -> str:
    """A few words on how the child ended, e.g. "crashed with signal 11 (SIGSEGV)"."""
    if returncode == EXIT_LOAD_REFUSED:
        return "it refused to load it"
    if returncode < 0:
        number = -returncode
        try:
            return f"crashed with signal {number} ({signal.Signals(number).name})"
        except ValueError:
            return f"crashed with signal {number}"
    return f"the check exited with code {returncode}"


def _load_vocabulary_only(model_path: str) -> int:
    try:
        import llama_cpp
    except Exception:  # any import failure means the engine, not the file, is broken
        return EXIT_ENGINE_MISSING
    try:
        model = llama_cpp.Llama(model_path=model_path, vocab_only=True, verbose=False)
    except Exception:  # llama-cpp-python reports load failures as ValueError or RuntimeError
        return EXIT_LOAD_REFUSED
    model.close()
    return EXIT_OK


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        sys.stderr.write(f"usage: python -m {CHILD_MODULE} MODEL.gguf\n")
        return EXIT_USAGE
    return _load_vocabulary_only(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

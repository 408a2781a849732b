"""The first full load of a new model file happens in a child process.

The pure-Python validator catches the malformed files we know about, but llama.cpp has had
memory-safety bugs and aborts (GGML_ASSERT) for files the validator cannot foresee, and some
files make its loader spin forever. Loading the file once in a throwaway process, with a real
(tiny) context and one decoded token, means such a file costs a failed check, not a crashed or
frozen app (SECURITY.md). The child's stderr, where llama.cpp logs, is captured so the user
reads what llama.cpp objected to; a child past its deadline is killed with its whole process
group, so nothing is left running.

The child then compiles the file's chat template as every load will (Hearthside's capped
sandbox; llama-cpp-python compiles none, `template_free_llama.py`) and renders an ordinary
conversation with it, its address space allowed to grow by at most TEMPLATE_MEMORY_CAP_BYTES:
a template that builds gigabytes costs the check its cap, not the machine its memory, and the
file is not added (issue 36).

Run as `python -m hearthside.core.models.child_check PATH`: exits 0 when llama.cpp loads the
file and decodes a token and its template stays within its bounds, EXIT_LOAD_REFUSED when
llama.cpp refuses the file, EXIT_DECODE_FAILED when it loads but cannot decode,
EXIT_TEMPLATE_REFUSED when its chat template does not compile or passes a bound,
EXIT_ENGINE_MISSING when llama-cpp-python cannot be imported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from llama_cpp import Llama

from hearthside.core.errors import EngineError, ModelFileError, TemplateError
from hearthside.core.units import MIB, format_bytes

CHILD_MODULE = "hearthside.core.models.child_check"
# Starting Python and llama.cpp takes a second or two; the rest is time to page in the
# weights for the one decode, which grows with the file (a cold 40 GB file on a slow disk).
BASE_TIMEOUT_S = 60.0
TIMEOUT_S_PER_GB = 15.0
CHECK_CONTEXT_TOKENS = 256
CHECK_PROMPT = b"Hello"

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_LOAD_REFUSED = 3
EXIT_ENGINE_MISSING = 4
EXIT_DECODE_FAILED = 5
EXIT_TEMPLATE_REFUSED = 6

# What compiling a new file's chat template and rendering two ordinary conversations with it
# may add to the check's address space (Linux; RLIMIT_AS). Real templates need a few MiB.
TEMPLATE_MEMORY_CAP_BYTES = 256 * MIB

# The child prefixes its own one-line explanations with this, so the parent can find them
# among llama.cpp's log lines.
REASON_MARKER = "hearthside-check:"
_KEPT_LOG_BYTES = 64 * 1024
_MAX_REASON_CHARS = 300
_KILL_WAIT_S = 5.0

_NOT_ADDED_HINT = (
    "The file may be damaged, or made for a newer llama.cpp than this Hearthside ships. "
    "Hearthside did not add it; download it again or choose another file."
)

log = logging.getLogger(__name__)


def check_loads_in_child(
    path: str | os.PathLike[str],
    timeout_s: float | None = None,
    *,
    command: Sequence[str] | None = None,
) -> None:
    """Raise ModelFileError unless llama.cpp fully loads `path` and decodes a token in a
    separate process within `timeout_s` (default: `deadline_for` the file's size).

    `command` replaces `python -m hearthside.core.models.child_check`; the path is appended to
    it. Tests use it to stand in a child that crashes or hangs.
    """
    deadline_s = timeout_s if timeout_s is not None else deadline_for(_size_of(path))
    argv = [*(command if command is not None else _child_command()), os.fspath(path)]
    with tempfile.TemporaryFile() as log_file:
        returncode = _run_contained(argv, log_file, deadline_s)
        log_tail = _read_tail(log_file)
    if returncode == EXIT_OK:
        return
    log.debug("child check of %s ended with %s: %s", path, returncode, log_tail[-4000:])
    raise _failure_error(returncode, log_tail)


def deadline_for(size_bytes: int) -> float:
    """How long the child may take: a minute, plus time to read a big file from a slow disk."""
    return BASE_TIMEOUT_S + TIMEOUT_S_PER_GB * size_bytes / 1e9


def _size_of(path: str | os.PathLike[str]) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0  # the child will say what is wrong with it


def _child_command() -> list[str]:
    return [sys.executable, "-m", CHILD_MODULE]


# --- the parent side -------------------------------------------------------------------------


def _run_contained(argv: list[str], log_file: IO[bytes], deadline_s: float) -> int:
    """Run `argv` in its own process group with stderr to `log_file`; its exit status, or
    raise ModelFileError after killing the whole group when it outlives `deadline_s`."""
    try:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
        )
    except OSError as exc:
        raise EngineError(
            "Hearthside could not start a helper process to check this model file.",
            hint=f"The system said: {exc.strerror or exc}.",
        ) from exc
    prefer_for_oom_kill(child.pid)
    try:
        returncode = child.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        _kill_group(child)
        raise ModelFileError(
            f"llama.cpp did not finish loading this model file within {deadline_s:g} s, "
            "so Hearthside stopped it.",
            hint="The file is probably damaged (its numbers make llama.cpp loop). "
            "Hearthside did not add it; download it again or choose another file.",
        ) from None
    except BaseException:
        _kill_group(child)  # e.g. Ctrl+C while waiting: leave nothing running
        raise
    _kill_group(child)  # anything the child started and left behind
    return returncode


# Under a memory limit the kernel kills the largest process, which while a child starts is the
# app itself: it died without a word (issue 36, a chat under a 100 MB cgroup). Children that
# load models ask to go first; their death is reported, the app's would not be.
CHILD_OOM_SCORE_ADJ = 1000


def prefer_for_oom_kill(pid: int) -> None:
    """Make the kernel's OOM killer pick process `pid` (a child loading a model) before the
    app. Linux only; raising a score needs no privilege, and where it fails nothing changes."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/oom_score_adj").write_text(f"{CHILD_OOM_SCORE_ADJ}\n")


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    if os.name == "posix":
        with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
            os.killpg(child.pid, signal.SIGKILL)
    else:
        child.kill()
    try:
        child.wait(timeout=_KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        log.warning("model check process %s did not exit after SIGKILL", child.pid)


def _read_tail(log_file: IO[bytes]) -> str:
    size = log_file.seek(0, os.SEEK_END)
    log_file.seek(max(0, size - _KEPT_LOG_BYTES))
    return log_file.read().decode("utf-8", errors="replace")


def _failure_error(returncode: int, log_tail: str) -> ModelFileError | EngineError:
    if returncode == EXIT_ENGINE_MISSING:
        return EngineError(
            "Hearthside could not check this model file: llama-cpp-python failed to load.",
            hint="Reinstall Hearthside, or run `hearthside probe` to see what the engine reports.",
        )
    if os.name == "posix" and returncode == -signal.SIGKILL:
        # Only the kernel's OOM killer (or a user) sends it: the file was never judged.
        return EngineError(
            "The check of this model file was killed before it finished, most likely because "
            "the computer (or Hearthside's memory limit) ran out of memory.",
            hint="Close other programs or allow Hearthside more memory, then try again. The "
            "file was not found to be damaged.",
        )
    if returncode == EXIT_TEMPLATE_REFUSED:
        return _template_refused(log_tail)
    reason = reason_from_log(log_tail)
    if returncode < 0 or _is_abort(returncode, log_tail):
        detail = reason or f"llama.cpp {describe_exit(returncode)} while loading it"
        return ModelFileError(f"This file is damaged: {detail}.", hint=_NOT_ADDED_HINT)
    what = describe_exit(returncode)
    detail = f"{what}: {reason}" if reason else what
    return ModelFileError(
        f"llama.cpp could not load this model file ({detail}).", hint=_NOT_ADDED_HINT
    )


def _template_refused(log_tail: str) -> ModelFileError:
    # Only the child's own line: llama.cpp's log of a load that went well says nothing here.
    reason = _find_marker(_log_lines(log_tail)) or "It gave no reason"
    return ModelFileError(
        f"Hearthside did not add this model: its chat template failed the check. {_shown(reason)}.",
        hint="Use another copy of this model (for example from its original publisher), "
        "or tell whoever published this file.",
    )


def _is_abort(returncode: int, log_tail: str) -> bool:
    # Windows has no signals: an abort there is exit code 3 plus a GGML_ASSERT line.
    return returncode not in (EXIT_OK, EXIT_DECODE_FAILED) and "GGML_ASSERT" in log_tail


def describe_exit(returncode: int) -> str:
    """A few words on how the child ended, e.g. "crashed with signal 11 (SIGSEGV)"."""
    if returncode == EXIT_LOAD_REFUSED:
        return "it refused to load it"
    if returncode == EXIT_DECODE_FAILED:
        return "it loaded it but could not run it"
    if returncode < 0:
        number = -returncode
        try:
            return f"crashed with signal {number} ({signal.Signals(number).name})"
        except ValueError:
            return f"crashed with signal {number}"
    return f"the check exited with code {returncode}"


# The log holds text from the model file (llama.cpp logs `general.name` whole), so each pattern
# is anchored or starts with a literal, and its repetitions are bounded: linear on any line.
_ASSERT_START = "GGML_ASSERT("
_ASSERT_END = ") failed"
# ggml_abort writes "<source file>:<line>: <message>"; the path says nothing to a user.
_ABORT = re.compile(r"\S{1,512}\.(?:c|cpp|h):[0-9]{1,9}: (.+)$")
_LOAD_ERROR = re.compile(r"error loading model(?: architecture)?: (?:[a-z_]{1,64}: )?(.+)$")
_EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]{0,127}(?:Error|Exception)): (.+)$")


def reason_from_log(log_tail: str) -> str | None:
    """The line of llama.cpp's (or the child's) log that says why the load failed, if any."""
    lines = _log_lines(log_tail)
    for finder in (_find_assert, _find_load_error, _find_abort, _find_marker, _find_exception):
        found = finder(lines)
        if found:
            return _shown(found)
    return None


def _log_lines(log_tail: str) -> list[str]:
    return [line.strip() for line in log_tail.splitlines() if line.strip()]


def _find_assert(lines: list[str]) -> str | None:
    """The text `GGML_ASSERT(<condition>) failed`, found with str.find: a condition holds
    parentheses, and a regex seeking the last ") failed" after each "GGML_ASSERT(" is quadratic."""
    for line in reversed(lines):
        start = line.find(_ASSERT_START)
        end = line.rfind(_ASSERT_END)
        if 0 <= start < end:
            return line[start : end + len(_ASSERT_END)]
    return None


def _find_marker(lines: list[str]) -> str | None:
    for line in reversed(lines):
        if line.startswith(REASON_MARKER):
            return line.removeprefix(REASON_MARKER).strip()
    return None


def _find_load_error(lines: list[str]) -> str | None:
    for line in reversed(lines):
        match = _LOAD_ERROR.search(line)
        if match:
            return match.group(1)
    return None


def _find_abort(lines: list[str]) -> str | None:
    for line in reversed(lines):
        match = _ABORT.match(line)
        if match:
            return match.group(1)
    return None


def _find_exception(lines: list[str]) -> str | None:
    for line in reversed(lines):
        match = _EXCEPTION_LINE.match(line)
        if match:
            return f"{match.group(1)}: {match.group(2)}"
    return None


def _shown(text: str) -> str:
    # Cut before the per-character pass: a log line can be megabytes of model-file text.
    text = text[: _MAX_REASON_CHARS * 4]
    printable = " ".join("".join(ch if ch.isprintable() else "?" for ch in text).split())
    printable = printable.rstrip(".")
    if len(printable) <= _MAX_REASON_CHARS:
        return printable
    return printable[: _MAX_REASON_CHARS - 3] + "..."


# --- the child side --------------------------------------------------------------------------


def _load_and_decode(model_path: str) -> int:
    try:
        from hearthside.core.engine.template_free_llama import (
            TemplateFreeLlama,
            special_token_texts,
        )
    except Exception:  # it imports llama_cpp: a failure means the engine, not the file, is broken
        return EXIT_ENGINE_MISSING
    try:
        # verbose: llama.cpp's log goes to stderr, which the parent keeps for its message.
        model = TemplateFreeLlama(
            model_path=model_path,
            n_ctx=CHECK_CONTEXT_TOKENS,
            n_batch=CHECK_CONTEXT_TOKENS,
            n_gpu_layers=0,
            use_mmap=True,
            verbose=True,
        )
    except Exception as exc:  # llama-cpp-python reports load failures as ValueError etc.
        _explain(exc)
        return EXIT_LOAD_REFUSED
    try:
        model.eval(_first_tokens(model))
        bos, eos = special_token_texts(model)
    except Exception as exc:
        _explain(exc)
        return EXIT_DECODE_FAILED
    finally:
        model.close()
    return _check_chat_template(model_path, bos, eos)


def _check_chat_template(model_path: str, bos: str, eos: str) -> int:
    """Compile the file's template and render ordinary conversations with it, as a chat
    would, with at most TEMPLATE_MEMORY_CAP_BYTES more address space."""
    from hearthside.core.engine.template_limits import TemplateOutOfMemoryError
    from hearthside.core.engine.templates import ChatTemplate, check_chat_template
    from hearthside.core.models.gguf_validator import validate_gguf

    source = validate_gguf(Path(model_path)).chat_template
    cap = format_bytes(TEMPLATE_MEMORY_CAP_BYTES)
    try:
        with address_space_cap(TEMPLATE_MEMORY_CAP_BYTES):
            check_chat_template(ChatTemplate(source, bos_token=bos, eos_token=eos))
    except (TemplateError, MemoryError) as exc:
        if isinstance(exc, MemoryError | TemplateOutOfMemoryError):
            reason = f"The chat template needed more than the {cap} of memory allowed to it"
        else:
            reason = str(exc).rstrip(".")
        sys.stderr.write(f"\n{REASON_MARKER} {reason}\n")
        sys.stderr.flush()
        return EXIT_TEMPLATE_REFUSED
    return EXIT_OK


@contextlib.contextmanager
def address_space_cap(extra_bytes: int) -> Iterator[None]:
    """Inside the block, allocations that would grow this process's address space by more
    than `extra_bytes` fail (MemoryError) instead of taking the machine's memory; the limit is
    put back afterwards. Linux only: elsewhere the block runs without a cap."""
    used = _address_space_bytes()
    if used is None:
        yield
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    capped = used + extra_bytes
    for limit in (soft, hard):
        if limit != resource.RLIM_INFINITY:
            capped = min(capped, limit)
    resource.setrlimit(resource.RLIMIT_AS, (capped, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _address_space_bytes() -> int | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def _first_tokens(model: Llama) -> list[int]:
    tokens = model.tokenize(CHECK_PROMPT, add_bos=True)[:2]
    return tokens or [0]


def _explain(exc: BaseException) -> None:
    sys.stderr.write(f"\n{REASON_MARKER} {type(exc).__name__}: {exc}\n")
    sys.stderr.flush()


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        sys.stderr.write(f"usage: python -m {CHILD_MODULE} MODEL.gguf\n")
        return EXIT_USAGE
    started = time.monotonic()
    status = _load_and_decode(argv[0])
    sys.stderr.write(f"\n{CHILD_MODULE}: done in {time.monotonic() - started:.1f} s\n")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

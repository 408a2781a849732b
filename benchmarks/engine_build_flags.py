"""The CPU build Hearthside now makes (this CPU's instruction sets as explicit flags, AMX off)
against another build of the same llama.cpp, e.g. the GGML_NATIVE one pip made before, side by
side: same model, same threads, interleaved rounds, each run in its own child process.

    .venv/bin/python benchmarks/engine_build_flags.py --other-lib DIR [--model GGUF] [--rounds 5]

DIR holds another build's libllama/libggml (for instance `llama_cpp/lib` unzipped from pip's
cached wheel of a GGML_NATIVE build). Prints decode and prefill tok/s per build and the ratio
(decode: 64 tokens / their eval time; prefill: 256 prompt tokens / their eval time, the same
on both builds). No target: it compares two builds for a reader (exit status 0 unless it fails
to run); it reads nothing from a data folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _targets import report

CHILD = """
import json, sys, time
from llama_cpp import Llama, llama_print_system_info
llama = Llama(model_path=sys.argv[1], n_ctx=1024, n_threads=int(sys.argv[2]),
              n_threads_batch=int(sys.argv[2]), flash_attn=True, verbose=False)
prompt = list(range(100, 356))
start = time.perf_counter(); llama.eval(prompt); prefill = time.perf_counter() - start
start = time.perf_counter()
for token in range(400, 464):
    llama.eval([token])
decode = time.perf_counter() - start
print(json.dumps({"prefill_tok_s": len(prompt) / prefill, "decode_tok_s": 64 / decode,
                  "system_info": llama_print_system_info().decode()}))
"""


def run_once(model: Path, threads: int, lib: Path | None) -> dict[str, float | str]:
    env = dict(os.environ)
    if lib is not None:
        env["LLAMA_CPP_LIB_PATH"] = str(lib)
        env["LD_LIBRARY_PATH"] = f"{lib}:{env.get('LD_LIBRARY_PATH', '')}"
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(threads)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other-lib", type=Path, required=True)
    parser.add_argument("--model", type=Path, help="GGUF (default: the default chat model)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.model is None:
        from hearthside.core.models.default_model import cached_default_model_file

        args.model = cached_default_model_file()
    builds = {"installed": None, "other": args.other_lib}
    results: dict[str, list[dict[str, float | str]]] = {name: [] for name in builds}
    for _ in range(args.rounds):
        for name, lib in builds.items():
            results[name].append(run_once(args.model, args.threads, lib))
    print(f"engine_build_flags: {args.model.name}, {args.threads} threads, {args.rounds} rounds")
    medians = {}
    for name, runs in results.items():
        decode = statistics.median(float(run["decode_tok_s"]) for run in runs)
        prefill = statistics.median(float(run["prefill_tok_s"]) for run in runs)
        medians[name] = (decode, prefill)
        print(f"  {name:9} decode {decode:7.1f} tok/s  prefill {prefill:7.1f} tok/s")
        print(f"            {runs[0]['system_info']}")
    (decode_a, prefill_a), (decode_b, prefill_b) = medians["installed"], medians["other"]
    ratios = f"decode {decode_a / decode_b:.3f}, prefill {prefill_a / prefill_b:.3f}"
    print(f"  installed / other: {ratios}")
    return report([])


if __name__ == "__main__":
    sys.exit(main())

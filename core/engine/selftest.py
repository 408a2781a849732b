"""The engine's self-test, run as a child process: `python -m hearthside.core.engine.selftest
--model FILE`. It loads the model as the app would (flash attention, every core), evaluates a
prompt of a few dozen tokens as one batch, and decodes a few tokens one at a time, then prints
one JSON line on stdout. A build that crashes (ggml's AMX matmul on Sapphire Rapids, an
instruction this CPU lacks) kills this child, not the app; the parent reads the signal
(core/probe/engine_ladder.py). faulthandler prints the Python stack on stderr when it does.

Only llama_cpp and the standard library are imported, so a broken build fails here first.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time

PROMPT = (
    "The quick brown fox jumps over the lazy dog. Water boils at one hundred degrees Celsius "
    "at sea level. The capital of France is"
)
DECODE_TOKENS = 8
CONTEXT_TOKENS = 512


def run(model_path: str, threads: int, gpu_layers: int = 0) -> dict[str, object]:
    from llama_cpp import Llama, llama_print_system_info

    started = time.perf_counter()
    llama = Llama(
        model_path=model_path,
        n_ctx=CONTEXT_TOKENS,
        n_gpu_layers=gpu_layers,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=True,
        verbose=True,  # the native log goes to stderr, which the parent keeps for its report
    )
    loaded = time.perf_counter()
    tokens = llama.tokenize(PROMPT.encode(), add_bos=True)
    produced: list[int] = []
    first_token_at = loaded
    for token in llama.generate(tokens, temp=0.0):  # the prompt as one batch, then one by one
        if not produced:
            first_token_at = time.perf_counter()
        produced.append(token)
        if len(produced) >= DECODE_TOKENS or token == llama.token_eos():
            break
    decoded = time.perf_counter()
    text = llama.detokenize(produced).decode("utf-8", errors="replace")
    llama.close()
    return {
        "status": "passed",
        "prompt_tokens": len(tokens),
        "decoded_tokens": len(produced),
        "text": text,
        "load_s": round(loaded - started, 3),
        "prompt_tok_s": round(len(tokens) / max(first_token_at - loaded, 1e-9), 1),
        "decode_tok_s": round((len(produced) - 1) / max(decoded - first_token_at, 1e-9), 1),
        "system_info": llama_print_system_info().decode("utf-8", errors="replace").strip(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Prove this llama.cpp build on one model.")
    parser.add_argument("--model", required=True, help="a small GGUF to load")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--gpu-layers", type=int, default=0, help="layers to offload (-1: all; a CPU build: none)"
    )
    args = parser.parse_args(argv)
    faulthandler.enable()
    result = run(args.model, max(1, args.threads), args.gpu_layers)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

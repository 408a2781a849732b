"""Hearthside's measured quality against llama.cpp's own `llama-perplexity --kl-divergence`.

On the same files and the same text (`assets/eval/quality-eval.txt`), at the same context,
batch, flash attention and KV-cache types: the default model SmolLM2 135M Instruct Q4_1 as
the reference (f16 KV), its Q4_0 and Q8_0 re-quantizations, and the reference file with
q8_0 and q4_0 KV caches. For each candidate: mean KLD, perplexity and top-1 agreement from
`autotune/quality.py` and from llama-perplexity, with their ratios. Hearthside keeps only
the reference's top-64 tokens per position (plus the tail's mass); llama-perplexity keeps
every token (as 16-bit log-probabilities), so this also checks that top-64 is enough.

    .venv/bin/python benchmarks/quality_agreement.py [--ctx 512] [--threads N] [--json]
        [--use-my-data]

llama-perplexity is the one `../shared/tools/build-native-llama.sh` builds from the vendored
llama.cpp (default ~/.cache/hearthside-native/<version>/build/bin; `--tool` to choose).
Runs on a fresh data folder unless `--use-my-data`. Target: every KLD and perplexity ratio
within 5%; exit status 1 otherwise. Never run in CI.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import llama_cpp
from _setup import add_data_option, data_home, print_settings
from _targets import Target, report

from hearthside.autotune.quality import Candidate, load_eval_text, measure_quality
from hearthside.autotune.wisdom import QualityRecord, WisdomDB

LLAMA_FTYPE = {"Q8_0": 7, "Q4_0": 2}
TARGET = 0.05
PATTERNS = {
    "ppl": r"Mean PPL\(Q\)\s*:\s*([\d.]+)",
    "kld": r"Mean\s+KLD:\s*([-\d.]+)",
    "top1": r"Same top p:\s*([\d.]+)",
}


def default_tool() -> Path:
    build = Path.home() / ".cache" / "hearthside-native" / version("llama-cpp-python")
    return build / "build" / "bin" / "llama-perplexity"


def requantize(source: Path, quant: str, folder: Path) -> Path:
    target = folder / f"{source.stem.split('.')[0]}.{quant}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE[quant]
    params.allow_requantize = True
    if llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    ):
        raise SystemExit(f"quantizing to {quant} failed")
    return target


def run_tool(tool: Path, arguments: list[str]) -> str:
    env = {**os.environ, "LD_LIBRARY_PATH": str(tool.parent)}
    done = subprocess.run(
        [str(tool), *arguments], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"llama-perplexity failed:\n{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def tool_figures(output: str) -> dict[str, float]:
    figures = {}
    for name, pattern in PATTERNS.items():
        match = re.search(pattern, output)
        if match is None:
            raise SystemExit(f"no {name} in llama-perplexity's output:\n{output[-2000:]}")
        figures[name] = float(match.group(1))
    figures["top1"] /= 100
    return figures


def common_flags(text_file: Path, ctx: int, threads: int, kv: str) -> list[str]:
    # -b = -c: one sequence per batch, as Hearthside evaluates (llama-perplexity would put
    # 2048 / ctx chunks side by side otherwise)
    return ["-f", str(text_file), "-c", str(ctx), "-b", str(ctx), "-fa", "on", "-t",
            str(threads), "-ctk", kv, "-ctv", kv]  # fmt: skip


def hearthside_figures(
    reference: Candidate, candidates: list[Candidate], ctx: int, folder: Path
) -> list[QualityRecord]:
    with WisdomDB(folder / "wisdom.db") as db:
        report = measure_quality(
            reference,
            candidates,
            db,
            n_ctx=ctx,
            cache_dir=folder,
            progress=lambda what, done, total: print(
                f"\r  hearthside {what}: {done}/{total}\033[K", end="", file=sys.stderr
            ),
        )
    print(file=sys.stderr)
    return [result.record for result in report.results]


def llama_figures(
    tool: Path, reference: Candidate, candidates: list[Candidate], ctx: int, threads: int,
    folder: Path,
) -> list[dict[str, float]]:  # fmt: skip
    text_file = folder / "eval.txt"
    text_file.write_text(load_eval_text().text + "\n", encoding="utf-8")  # -f drops one "\n"
    base = folder / "reference.kld"
    flags = common_flags(text_file, ctx, threads, "f16")
    print("  llama-perplexity: reference", file=sys.stderr)
    run_tool(tool, ["-m", str(reference.path), *flags, "--kl-divergence-base", str(base)])
    figures = []
    for candidate in candidates:
        print(f"  llama-perplexity: {candidate.name}", file=sys.stderr)
        flags = common_flags(text_file, ctx, threads, candidate.kv_type)
        output = run_tool(
            tool,
            ["-m", str(candidate.path), *flags, "--kl-divergence-base", str(base),
             "--kl-divergence"],
        )  # fmt: skip
        figures.append(tool_figures(output))
    return figures


def ratio(ours: float, theirs: float) -> float:
    if theirs == 0:
        return 1.0 if abs(ours) < 1e-6 else float("inf")
    return ours / theirs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tool", type=Path, default=default_tool())
    parser.add_argument("--json", action="store_true")
    add_data_option(parser)
    args = parser.parse_args(argv)
    if not args.tool.exists():
        raise SystemExit(
            f"no llama-perplexity at {args.tool}: build it with "
            "`bash ../shared/tools/build-native-llama.sh`, or pass --tool PATH"
        )
    out = sys.stderr if args.json else sys.stdout
    with (
        data_home(args.use_my_data) as home,
        tempfile.TemporaryDirectory(prefix="quality-agreement-") as scratch,
    ):
        folder = Path(scratch)
        source = home.default_chat_model()
        print(home.describe(), file=out)
        print_settings(
            "both tools",
            {"reference": f"{source} (f16 KV)", "ctx": args.ctx, "batch": args.ctx,
             "threads (llama-perplexity)": args.threads, "flash attention": "on",
             "text": "assets/eval/quality-eval.txt", "tool": str(args.tool)},
            out,
        )  # fmt: skip
        reference = Candidate(source, "Q4_1")
        candidates = [
            Candidate(requantize(source, "Q4_0", folder), "Q4_0"),
            Candidate(requantize(source, "Q8_0", folder), "Q8_0"),
            Candidate(source, "Q4_1", "q8_0"),
            Candidate(source, "Q4_1", "q4_0"),
        ]
        ours = hearthside_figures(reference, candidates, args.ctx, folder)
        theirs = llama_figures(args.tool, reference, candidates, args.ctx, args.threads, folder)
    rows = [row_of(c, o, t) for c, o, t in zip(candidates, ours, theirs, strict=True)]
    if args.json:
        print(json.dumps({"ctx": args.ctx, "rows": rows}, indent=1))
    else:
        print_table(rows, args.ctx, ours[0].reference_perplexity, ours[0].n_tokens)
    return report(targets_of(rows), out)


def targets_of(rows: list[dict]) -> list[Target]:
    """The worst KLD and perplexity ratio, Hearthside / llama-perplexity, off 1 by at most 5%."""
    return [
        Target(f"worst {name} ratio Hearthside / llama-perplexity, off 1 by",
               max(abs(row[f"{key}_ratio"] - 1) for row in rows), TARGET, "at most", unit="")
        for name, key in (("KLD", "kld"), ("perplexity", "ppl"))
    ]  # fmt: skip


def row_of(candidate: Candidate, ours: QualityRecord, theirs: dict[str, float]) -> dict:
    return {
        "candidate": candidate.name,
        "kld": ours.mean_kld,
        "kld_llama": theirs["kld"],
        "kld_ratio": ratio(ours.mean_kld, theirs["kld"]),
        "ppl": ours.perplexity,
        "ppl_llama": theirs["ppl"],
        "ppl_ratio": ratio(ours.perplexity, theirs["ppl"]),
        "top1": ours.top1_agreement,
        "top1_llama": theirs["top1"],
    }


def print_table(rows: list[dict], ctx: int, reference_ppl: float, n_tokens: int) -> None:
    print(f"reference SmolLM2 135M Q4_1, f16 KV: PPL {reference_ppl:.4f}; "
          f"{n_tokens} tokens scored in chunks of {ctx}")  # fmt: skip
    header = f"{'candidate':16} {'KLD':>8} {'llama':>8} {'ratio':>6}  {'PPL':>8} {'llama':>8} "
    print(header + f"{'ratio':>6}  {'top-1':>6} {'llama':>6}")
    for row in rows:
        print(
            f"{row['candidate']:16} {row['kld']:8.5f} {row['kld_llama']:8.5f} "
            f"{row['kld_ratio']:6.3f}  {row['ppl']:8.4f} {row['ppl_llama']:8.4f} "
            f"{row['ppl_ratio']:6.3f}  {row['top1']:6.1%} {row['top1_llama']:6.1%}"
        )


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# The GPU truth check for one device run (docs/gpu.md): a CUDA engine for the GPU found, its
# self-test on the GPU, the probe against nvidia-smi, plan against reality (memory per device,
# decode/prefill) and the tuner against llama.cpp's defaults. Writes OUT/device-check.json and
# prints the ratios; exit status 0 when every target is met, 1 on a miss, 3 without a GPU.
#
#   bash benchmarks/device_check.sh            # on the device machine (≤ 8 minutes on an H200)
#   bash benchmarks/device_check.sh --dry      # here: the plumbing, no GPU needed (DRY=1 too)
#   bash benchmarks/device_check.sh --prepare  # here: fill .device-carry/ for the device run
#
# Environment: OUT (default ./device-check-out), PYTHON (default .venv/bin/python, else
# python3), ENGINE_WHEELS (another folder of cached engine wheels), LLAMA_CPP_SDIST (a carried
# sdist to compile from when no wheel fits), LLAMA_BENCH (a native llama-bench), MODELS_DIR.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="device"
case "${1:-}" in
  --dry) MODE="dry" ;;
  --prepare) MODE="prepare" ;;
  "") ;;
  *) echo "usage: $0 [--dry | --prepare]" >&2; exit 2 ;;
esac
if [[ "${DRY:-0}" == "1" && "$MODE" == "device" ]]; then MODE="dry"; fi

CARRY="$ROOT/.device-carry"
SITE="${SITE:-/tmp/hearthside-site}"
OUT="${OUT:-$ROOT/device-check-out}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" && "$MODE" != "device" ]]; then PYTHON="$ROOT/.venv/bin/python"
  else PYTHON="python3"; fi
fi
export PYTHONUNBUFFERED=1
cd "$ROOT"

# Wheels of what Hearthside needs that the device image lacks (KINDS.md's package list), for
# its Python 3.12; with the CUDA wheel, all of it travels in .device-carry (one `carry` path).
DEPENDENCIES=(gguf sqlite-utils sqlite-fts4 click-default-group pydantic pydantic-core
  annotated-types typing-inspection pydantic-settings python-dotenv platformdirs fastapi
  starlette uvicorn jsonschema-rs)

prepare() {
  mkdir -p "$CARRY/wheels" "$CARRY/engine-wheels"
  local pinned=() name
  for name in "${DEPENDENCIES[@]}"; do  # the versions this checkout is tested with
    pinned+=("$name==$("$PYTHON" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$name")")
  done
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$CARRY/wheels" "${pinned[@]}"
  local cached="${ENGINE_WHEELS:-$HOME/.cache/hearthside/engine-wheels}"
  local arch="${ARCH:-90}"  # the lent machines' (H100, H200); ARCH=… for another
  if ! "$PYTHON" benchmarks/device_check.py carry "$cached" "$CARRY/engine-wheels" "$arch"; then
    echo "prepare: no sm_$arch CUDA wheel in $cached: run benchmarks/cuda_build.py first" >&2
    exit 1
  fi
  du -sh "$CARRY"
  echo "prepare: carry .device-carry in the device run (docs/gpu.md)"
}

step() {  # step NAME SECONDS: one step of device_check.py, its output in the log too
  local name="$1" limit="$2" status
  local flags=(--out "$OUT" --site "$SITE")
  if [[ "$MODE" == "dry" ]]; then flags+=(--dry); fi
  set +e
  timeout "$limit" "$PYTHON" benchmarks/device_check.py "$name" "${flags[@]}" 2>&1 \
    | tee -a "$OUT/device-check.log"
  status="${PIPESTATUS[0]}"
  set -e
  if [[ "$status" == 124 ]]; then echo "device_check: $name ran past ${limit} s" | tee -a "$OUT/device-check.log"; fi
  return "$status"
}

install_hearthside() {  # on the device: the carried wheels and Hearthside itself into $SITE
  mkdir -p "$SITE"
  if compgen -G "$CARRY/wheels/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$CARRY"/wheels/*.whl
  fi
  "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target "$SITE" .
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  # the CUDA wheel needs libcudart.so.13 and libcublas.so.13: the toolkit's, or the ones the
  # image's PyTorch brought (nvidia/cu13/lib), which are not on the loader's path by themselves
  local wheels_lib
  wheels_lib="$("$PYTHON" -c 'import nvidia, pathlib; print(pathlib.Path(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)"
  for lib in /usr/local/cuda/lib64 "$wheels_lib"; do
    if [[ -n "$lib" && -d "$lib" ]]; then export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
  done
}

if [[ "$MODE" == "prepare" ]]; then prepare; exit 0; fi

mkdir -p "$OUT"
: > "$OUT/device-check.log"
started=$SECONDS
# preflight first and standard library only: without a GPU the device run stops here, loudly.
step preflight 60 || exit $?
if [[ "$MODE" == "device" ]]; then install_hearthside; fi
failed=0
step engine 420 || failed=1
if [[ "$failed" == 0 ]]; then
  step probe 90 || failed=1
  step plan 300 || failed=1
  step tune 180 || failed=1
fi
step report 60 || failed=1
echo "device_check: $MODE run took $((SECONDS - started)) s" | tee -a "$OUT/device-check.log"
exit "$failed"

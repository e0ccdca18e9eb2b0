#!/usr/bin/env bash
# CI's second job: the oldest torch hipress declares (`torch>=X.Y` in pyproject.toml), in a venv
# of its own (.venv-oldest-torch, kept between runs), running the tests that touch the torch APIs
# whose spelling changed across the supported range: FSDP2, CaSync, the CUDA kernels' emulation
# (and collection of the GPU tests) and hipress.core.torchcompat.
#
# Usage: bash .ci/oldest-torch.sh [PYTEST ARGS]
#
# PyPI's Linux torch wheels of that version are CUDA builds: several GB with their NVIDIA
# libraries, which torch needs even to import, so they are all installed; the tests run on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

VENV="${HIPRESS_OLDEST_VENV:-.venv-oldest-torch}"
oldest="$(sed -n 's/^ *"torch>=\([0-9][0-9.]*\)".*/\1/p' pyproject.toml)"
if [[ ! "$oldest" =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]]; then
    echo "[oldest-torch] no \"torch>=X.Y\" dependency found in pyproject.toml" >&2
    exit 1
fi
[[ "$oldest" =~ ^[0-9]+\.[0-9]+$ ]] && oldest="$oldest.0"
pin="torch==$oldest"
STAMP="$VENV/.hipress-setup-$oldest"

if [[ ! -f "$STAMP" || pyproject.toml -nt "$STAMP" ]]; then
    echo "[oldest-torch] setting up $VENV: $pin, hipress[test,demo] (as ./run setup does)"
    [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
    pip=("$VENV/bin/python" -m pip -q)
    "${pip[@]}" install "$pin"
    # the pin again, so that no requirement of the extras can move torch
    "${pip[@]}" install -e '.[test,demo]' "$pin"
    touch "$STAMP"
fi
got="$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)"
if [[ "$got" != "$oldest" ]]; then
    echo "[oldest-torch] $VENV has torch $got, expected $oldest" >&2
    exit 1
fi

echo "[oldest-torch] pytest under torch $oldest"
tests=(tests/test_core_torchcompat.py tests/test_core_release.py tests/test_fsdp*.py tests/test_casync_*.py
       tests/test_cuda_emu.py tests/test_cuda.py)
rc=0
"$VENV/bin/pytest" -q -p no:cacheprovider "${tests[@]}" "$@" || rc=$?
if [[ $rc -eq 5 ]]; then
    echo "[oldest-torch] pytest collected no tests" >&2
fi
exit "$rc"

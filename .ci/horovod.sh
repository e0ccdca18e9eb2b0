#!/usr/bin/env bash
# Build (once) and install Horovod 0.28.1 with its PyTorch + Gloo CPU backend into a venv.
#
# Usage: bash .ci/horovod.sh [PYTHON]      (PYTHON defaults to `python`)
#
# Horovod 0.28.1 (its last release) compiles its torch extension with -std=c++14, which torch 2.x
# headers reject. This script downloads the hash-pinned sdist from PyPI, switches both
# CMAKE_CXX_STANDARD settings to 17, builds a wheel against the installed torch, and keeps the wheel
# in a cache keyed by horovod version, torch version, python tag/platform and a hash of this
# script, so a re-run with the same torch only reinstalls (or does nothing at all).
#
# Environment:
#   HIPRESS_WHEEL_CACHE  cache root (default: $HOME/.cache/hipress/wheels)
#   MAKEFLAGS            passed to make (default: -j<nproc>; horovod's own default is -j8)
set -euo pipefail

readonly HVD_VERSION=0.28.1
readonly HVD_SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0
readonly RUNTIME_DEPS=(cloudpickle psutil pyyaml packaging 'cffi>=1.4.0')

log() { printf '[horovod.sh] %s\n' "$*"; }
die() {
    printf '[horovod.sh] ERROR: %s\n' "$*" >&2
    exit 1
}

PY_ARG="${1:-python}"
PY="$(command -v "$PY_ARG" || true)"
[[ -n "$PY" ]] || die "python '$PY_ARG' not found"
pip_() { "$PY" -m pip --disable-pip-version-check "$@"; }

TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" ||
    die "torch is not importable with $PY; install torch (2.13.0) into this venv first"
PY_TAG="$("$PY" -c 'import sys, sysconfig
print(f"cp{sys.version_info[0]}{sys.version_info[1]}-" + sysconfig.get_platform().replace("-", "_").replace(".", "_"))')"
SCRIPT_PATH="${BASH_SOURCE[0]}"
RECIPE_HASH="$(sha256sum "$SCRIPT_PATH" | cut -c1-12)"
CACHE_ROOT="${HIPRESS_WHEEL_CACHE:-$HOME/.cache/hipress/wheels}"
CACHE_DIR="$CACHE_ROOT/horovod-$HVD_VERSION/torch-$TORCH_VERSION/$PY_TAG/recipe-$RECIPE_HASH"

log "python: $PY ($PY_TAG), torch $TORCH_VERSION"
log "wheel cache: $CACHE_DIR"

find_cached_wheel() {
    local found=()
    shopt -s nullglob
    found=("$CACHE_DIR"/horovod-"$HVD_VERSION"-*.whl)
    shopt -u nullglob
    ((${#found[@]} <= 1)) || die "several wheels in $CACHE_DIR; remove the stale ones: ${found[*]}"
    ((${#found[@]} == 1)) && printf '%s\n' "${found[0]}"
    return 0
}

# Prints "yes" if horovod is installed in this venv from exactly this wheel file.
installed_from() {
    "$PY" - "$1" <<'EOF'
import json, pathlib, sys
from importlib import metadata
try:
    info = json.loads(metadata.distribution("horovod").read_text("direct_url.json") or "{}")
except metadata.PackageNotFoundError:
    info = {}
print("yes" if info.get("url") == pathlib.Path(sys.argv[1]).resolve().as_uri() else "no")
EOF
}

ensure_runtime_deps() {
    if "$PY" -c 'import cloudpickle, psutil, yaml, packaging, cffi' 2>/dev/null; then
        log "runtime deps present (cloudpickle, psutil, pyyaml, packaging, cffi)"
    else
        log "installing runtime deps: ${RUNTIME_DEPS[*]}"
        pip_ install --progress-bar off "${RUNTIME_DEPS[@]}"
    fi
}

verify_install() {
    "$PY" - <<'EOF' || die "horovod installed but its torch/gloo extension does not load"
import horovod, horovod.torch as hvd
assert horovod.__version__ == "0.28.1", horovod.__version__
assert hvd.gloo_built(), "gloo not built"
print(f"[horovod.sh] ok: horovod {horovod.__version__}, gloo_built={hvd.gloo_built()}, "
      f"mpi_built={hvd.mpi_built()}, horovodrun in {__import__('sysconfig').get_path('scripts')}")
EOF
}

install_wheel() {
    local wheel="$1"
    ensure_runtime_deps
    if [[ "$(installed_from "$wheel")" == yes ]]; then
        log "horovod $HVD_VERSION already installed from $(basename "$wheel"); nothing to do"
    else
        log "installing $(basename "$wheel")"
        pip_ install --progress-bar off --no-deps --force-reinstall "$wheel"
    fi
    verify_install
}

WHEEL="$(find_cached_wheel)"
if [[ -n "$WHEEL" ]]; then
    log "cache hit: $(basename "$WHEEL")"
    install_wheel "$WHEEL"
    exit 0
fi

log "cache miss: building horovod $HVD_VERSION from source (takes ~4-5 min on 2 cores)"
mkdir -p "$CACHE_DIR"
# Serialise concurrent builders of the same key; the second one then finds the wheel.
if command -v flock >/dev/null; then
    exec 9>"$CACHE_DIR/.lock"
    flock 9
    WHEEL="$(find_cached_wheel)"
    if [[ -n "$WHEEL" ]]; then
        log "another run built it meanwhile: $(basename "$WHEEL")"
        install_wheel "$WHEEL"
        exit 0
    fi
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/hipress-horovod.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# Build requirements (no build isolation: horovod must see the installed torch).
ensure_runtime_deps
if ! "$PY" -c 'import importlib.util, sys, setuptools
version = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
sys.exit(0 if version >= (70, 1) or importlib.util.find_spec("wheel") else 1)' 2>/dev/null; then
    log "installing build tools: setuptools, wheel (bdist_wheel needs setuptools>=70.1 or wheel)"
    pip_ install --progress-bar off setuptools wheel
fi

log "downloading sdist horovod==$HVD_VERSION from PyPI (sha256 pinned)"
printf 'horovod==%s --hash=sha256:%s\n' "$HVD_VERSION" "$HVD_SDIST_SHA256" >"$WORK/requirements.txt"
pip_ download --progress-bar off --no-deps --no-binary :all: --no-build-isolation \
    -d "$WORK/sdist" -r "$WORK/requirements.txt" >"$WORK/download.log" 2>&1 ||
    {
        cat "$WORK/download.log" >&2
        die "pip download failed"
    }
tar -xzf "$WORK/sdist/horovod-$HVD_VERSION.tar.gz" -C "$WORK"
SRC="$WORK/horovod-$HVD_VERSION"

log "patching CMAKE_CXX_STANDARD 14 -> 17 (torch 2.x headers need C++17)"
for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
    pattern='set(CMAKE_CXX_STANDARD 14)'
    grep -qF "$pattern" "$SRC/$f" || die "pattern '$pattern' not found in $f; the sdist changed?"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$SRC/$f"
    ! grep -qF "$pattern" "$SRC/$f" || die "patch of $f did not apply"
    grep -qF 'set(CMAKE_CXX_STANDARD 17)' "$SRC/$f" || die "patch of $f did not apply"
done

log "building wheel with MAKEFLAGS=${MAKEFLAGS:--j$(nproc)} (full log goes to the cache dir on success)"
start=$SECONDS
# GPU selectors from the caller's environment would turn on a CUDA build: drop them.
if ! env -u HOROVOD_GPU -u HOROVOD_GPU_OPERATIONS -u HOROVOD_GPU_ALLREDUCE \
    -u HOROVOD_GPU_ALLGATHER -u HOROVOD_GPU_BROADCAST -u HOROVOD_GPU_ALLTOALL \
    -u HOROVOD_GPU_REDUCESCATTER -u HOROVOD_CUDA_HOME -u HOROVOD_LOCAL_VERSION \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_NVTX=1 \
    MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}" \
    "$PY" -m pip --disable-pip-version-check wheel -v --progress-bar off \
    --no-build-isolation --no-deps -w "$WORK/dist" "$SRC" >"$WORK/build.log" 2>&1; then
    tail -n 80 "$WORK/build.log" >&2
    die "wheel build failed after $((SECONDS - start)) s (last 80 lines of the log above)"
fi
log "wheel built in $((SECONDS - start)) s"

shopt -s nullglob
built=("$WORK"/dist/horovod-"$HVD_VERSION"-*.whl)
shopt -u nullglob
((${#built[@]} == 1)) || die "expected one horovod wheel in $WORK/dist, found ${#built[@]}"
"$PY" - "${built[0]}" <<'EOF' || die "built wheel lacks the torch extension (horovod/torch/mpi_lib_v2*.so)"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
sys.exit(0 if any(n.startswith("horovod/torch/mpi_lib_v2") and n.endswith(".so") for n in names) else 1)
EOF

# Atomic publish: copy next to the destination, then rename within the same filesystem.
WHEEL="$CACHE_DIR/$(basename "${built[0]}")"
cp "${built[0]}" "$CACHE_DIR/.incoming.$$"
cp "$WORK/build.log" "$CACHE_DIR/build.log"
mv -f "$CACHE_DIR/.incoming.$$" "$WHEEL"
log "cached $WHEEL"

install_wheel "$WHEEL"

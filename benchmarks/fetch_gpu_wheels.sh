#!/usr/bin/env bash
# fetch_gpu_wheels.sh [DIR] -- download the Python wheels that a GPU machine without network
# lacks for gpucc and its GPU tests, for CPython 3.12 on x86-64 Linux, into DIR (default .whl,
# which .gitignore keeps out of the repository). Run it where pip reaches a package index;
# benchmarks/gpu_validate.sh --wheels DIR installs them there offline (docs/GPU-VALIDATION.md).
#
# What is fetched: the runtime dependencies of gpucc that a CUDA image with PyTorch, CuPy, NumPy,
# pytest, hypothesis, lxml, requests, rich, typer and PyYAML does not have --
#   cryptography (>= 50: GIL release, decrypt_into) and its cffi / pycparser,
#   platformdirs, PyJWT, signxml (RIM signatures), blake3 (model digests; the GPU tests and
#   bench_model.py compare with it).
# One pinned version of each (two wheels of one name stop an install). Change a pin with
#   GV_PINS="name==version ..." bash benchmarks/fetch_gpu_wheels.sh
# and GV_PYTHON_VERSION (default 3.12) for a machine with another Python.
set -euo pipefail

dir=${1:-.whl}
pyver=${GV_PYTHON_VERSION:-3.12}
default_pins="cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 platformdirs==4.14.7 PyJWT==2.15.1 signxml==5.2.0 blake3==1.0.11"
read -r -a pins <<<"${GV_PINS:-$default_pins}"

# pip matches each manylinux_2_N tag exactly: name the ones these packages publish, the oldest
# glibc first so that the wheels load on any image with glibc >= 2.17.
platforms=(manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64
  manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64
  manylinux1_x86_64)
args=()
for p in "${platforms[@]}"; do args+=(--platform "$p"); done

mkdir -p "$dir"
norm() { echo "$1" | tr '[:upper:]-' '[:lower:]_'; }

# Other versions of the pinned names would leave two wheels of one name: remove them first.
for pin in "${pins[@]}"; do
  name=$(norm "${pin%%==*}")
  find "$dir" -maxdepth 1 -iname "${name}-*.whl" ! -iname "${name}-${pin##*==}-*.whl" -print -delete |
    sed 's/^/removed /'
done

python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyver" \
  --implementation cp "${args[@]}" -d "$dir" "${pins[@]}"

status=0
for pin in "${pins[@]}"; do
  name=$(norm "${pin%%==*}")
  count=$(find "$dir" -maxdepth 1 -iname "${name}-*.whl" | wc -l)
  if [ "$count" -ne 1 ]; then
    echo "ERROR: $count wheels for $pin in $dir" >&2
    status=1
  fi
done

# What each wheel still requires (extras left out), so that a missing dependency shows here
# rather than as an ImportError on the GPU machine.
for whl in "$dir"/*.whl; do
  python3 - "$whl" <<'PY'
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode("utf-8", "replace")
needs = [
    line.split(":", 1)[1].strip()
    for line in text.splitlines()
    if line.startswith("Requires-Dist:") and "extra ==" not in line
]
print(f"{sys.argv[1].rsplit('/', 1)[-1]}: needs {'; '.join(needs) or 'nothing'}")
PY
done
du -ch "$dir"/*.whl | tail -n 1
exit "$status"

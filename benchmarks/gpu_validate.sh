#!/usr/bin/env bash
# gpu_validate.sh -- check and time gpucc's GPU paths on one machine, in one call of < 10 minutes.
#
# From the project root, on a machine with one NVIDIA GPU (H100 / H200), CuPy, the CUDA tools
# (nvcc, ncu, compute-sanitizer) and no network; the wheels it lacks come from
# benchmarks/fetch_gpu_wheels.sh (see docs/GPU-VALIDATION.md):
#
#   bash benchmarks/gpu_validate.sh [--wheels DIR] [--budget SECONDS] [--steps a,b,...]
#
# Steps, in order, each time-boxed so that all of them fit one budget (default 530 s):
#   nvidia-smi     the card (read-only queries) and a 0.5 s sampler of clocks and power
#   wheels         offline install of DIR/*.whl (default .whl) into a scratch site directory
#   project        offline editable install of the project, no dependencies
#   imports        the packages the GPU path imports, with versions
#   static-model   benchmarks/sass_model.py: the static pipe model of gcm_chunks (in background)
#   smoke          benchmarks/gpu_smoke.py smoke: versions, NVRTC builds of the exact sources the
#                  runtime compiles (full log on failure), kernel attributes and occupancy, the
#                  load-time known answers, kernels alone at 4 MiB / 64 KiB / 16 MiB chunks with
#                  poisoned outputs and a tampered chunk, copy ceilings
#   pytest-gpu     GPUCC_GPU_BIG=1 pytest -m gpu over every module with GPU tests; a test
#                  skipped because the kernels are unusable is a failure here
#   bench-model    benchmarks/bench_model.py with its GPU rows (which must be there)
#   bench-ddp      benchmarks/bench_ddp_gpu.py: gradient sealing (message kernels) on DDP-shaped
#                  batches beside the device copy ceiling
#   ncu            Nsight Compute on gcm_chunks / gcm_finalize, beside the static model
#   san-memcheck   compute-sanitizer memcheck on a small staging run
#   san-racecheck  compute-sanitizer racecheck on the same run
#   bench-gpu      benchmarks/bench_gpu.py --check --size 4GiB (gate, then the table)
#
# Results in $OUT (default ./gpu-validate-out): summary.txt (printed last), nvidia-smi.txt,
# smoke.log, pytest.log, ncu.txt, sanitizer.log, bench.log, model.log, ddp.log. Exit status 0 only when
# every step ran and passed.
#
# GV_FAKE=1: a dry run of this script's own flow on a machine without a GPU: the Python steps
# run against tests/support/fake_cupy.py at small sizes, the steps that need the device are reported as
# "dry-run" and do not count; exit status 0 when every step that ran passed.
#
# Environment: OUT, GV_BUDGET_S (the budget), PYTHON (default python3), GV_FAKE.

set -uo pipefail # no -e: every step runs and records its own verdict

usage() { sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; }

WHEELS=.whl
BUDGET=${GV_BUDGET_S:-530}
STEPS=all
while [ $# -gt 0 ]; do
  case $1 in
    --wheels) WHEELS=${2:?--wheels needs a directory}; shift 2 ;;
    --wheels=*) WHEELS=${1#*=}; shift ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift 2 ;;
    --budget=*) BUDGET=${1#*=}; shift ;;
    --steps) STEPS=${2:?--steps needs a list}; shift 2 ;;
    --steps=*) STEPS=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu_validate.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [ ! -f staging/kernels/aesgcm.cu ] || [ ! -f benchmarks/gpu_smoke.py ]; then
  echo "gpu_validate.sh: run it from the project root" >&2
  exit 2
fi

FAKE=${GV_FAKE:-0}
PY=${PYTHON:-python3}
START=$(date +%s)
DEADLINE=$((START + BUDGET))
OUT=${OUT:-$PWD/gpu-validate-out}
mkdir -p "$OUT"
W=$(mktemp -d "${TMPDIR:-/tmp}/gpu-validate.XXXXXX")
for f in summary.txt nvidia-smi.txt smoke.log pytest.log ncu.txt sanitizer.log bench.log model.log; do
  rm -f "$OUT/$f"
  : >"$OUT/$f"
done
SUMMARY=$OUT/summary.txt
TABLE=$W/steps.txt
: >"$TABLE"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export CUPY_CACHE_DIR=$W/cupy-cache # every step builds into one kernel cache
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
FAILED=()
PTH=
declare -A STATUS

now() { date +%s; }
left() { echo $((DEADLINE - $(now))); }
say() { echo "[$(($(now) - START))s] $*"; }
wanted() { [ "$STEPS" = all ] || [[ ",$STEPS," == *",$1,"* ]]; }

# record NAME STATUS SECONDS [NOTE]: one row of the step table
record() {
  STATUS[$1]=$2
  printf '%-14s %-12s %5ss  %s\n' "$1" "$2" "$3" "${4:-}" >>"$TABLE"
  case $2 in ok | dry-run | not-asked) ;; *) FAILED+=("$1") ;; esac
}

# step NAME CAP RESERVE LOG CMD...: run CMD for at most min(CAP, time left - RESERVE) seconds,
# its output appended to LOG. RESERVE is the time kept for the steps after this one.
step() {
  local name=$1 cap=$2 reserve=$3 log=$4
  shift 4
  if ! wanted "$name"; then
    record "$name" not-asked 0
    return 1
  fi
  local avail=$(($(left) - reserve))
  local limit=$((cap < avail ? cap : avail))
  if [ "$limit" -lt 10 ]; then
    say "skip $name: ${avail}s left before the reserve"
    record "$name" OUT-OF-TIME 0 "not started: the budget was spent"
    return 1
  fi
  say "$name (limit ${limit}s)"
  printf '### %s: %s\n### limit %ss, started %s\n' "$name" "$*" "$limit" "$(date -u +%FT%TZ)" >>"$log"
  local t0=$SECONDS rc
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  local took=$((SECONDS - t0)) verdict=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    verdict=TIMED-OUT
  elif [ "$rc" -ne 0 ]; then
    verdict="FAILED($rc)"
  fi
  [ "$verdict" = ok ] || tail -n 8 "$log" >"$W/why-$name.txt"
  echo "### $name: $verdict after ${took}s" >>"$log"
  say "$name: $verdict (${took}s)"
  STEP_SECONDS=$took
  STEP_VERDICT=$verdict
  return 0
}

# finish NAME [NOTE]: record the step run last with its own verdict
finish() { record "$1" "$STEP_VERDICT" "$STEP_SECONDS" "${2:-}"; }

# downgrade NAME NOTE: a step that exited 0 but whose output shows a failure
downgrade() {
  STEP_VERDICT=FAILED
  finish "$1" "$2"
}

dry() { record "$1" dry-run 0 "${2:-needs the device}"; }

find_tool() { # on PATH, else where CUDA and Nsight usually live
  command -v "$1" 2>/dev/null && return 0
  local c
  for c in /usr/local/cuda/bin/"$1" /usr/local/cuda-*/bin/"$1" /usr/local/cuda*/compute-sanitizer/"$1" \
    /opt/nvidia/nsight-compute/*/"$1" /usr/local/cuda*/nsight-compute*/"$1"; do
    [ -x "$c" ] && {
      echo "$c"
      return 0
    }
  done
  return 1
}

say "gpu_validate.sh: budget ${BUDGET}s, results in $OUT, scratch $W"

# --- 1. the card, read-only, and a sampler for the whole run ---------------------------------------
SMI=$OUT/nvidia-smi.txt
SAMPLER=
if ! wanted nvidia-smi; then
  echo "not asked" >"$SMI"
  record nvidia-smi not-asked 0
elif [ "$FAKE" = 1 ]; then
  echo "dry run: nvidia-smi not queried" >"$SMI"
  dry nvidia-smi
elif command -v nvidia-smi >/dev/null 2>&1; then
  {
    nvidia-smi --query-gpu=name,driver_version,pci.bus_id,pstate,clocks.max.sm,clocks.max.mem,power.limit,memory.total \
      --format=csv
    nvidia-smi
    nvidia-smi -q
  } >"$SMI" 2>&1
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
    --format=csv,noheader,nounits -lms 500 >"$W/clocks.csv" 2>/dev/null &
  SAMPLER=$!
  record nvidia-smi ok 0
else
  echo "nvidia-smi not found" >"$SMI"
  record nvidia-smi MISSING 0
fi

# --- 2. carried wheels and the project ---------------------------------------------------------
SETUP_LOG=$OUT/smoke.log
NWHEELS=$(find "$WHEELS" -maxdepth 1 -type f -name '*.whl' 2>/dev/null | wc -l)
if ! wanted wheels; then
  record wheels not-asked 0
elif [ "$FAKE" = 1 ]; then
  dry wheels "$NWHEELS wheels in $WHEELS, for the device's Python: not installed here"
elif [ "$NWHEELS" -gt 0 ]; then
  if step wheels 90 400 "$SETUP_LOG" "$PY" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$W/site" "$WHEELS"/*.whl; then
    finish wheels "$NWHEELS wheels from $WHEELS"
  fi
  export PYTHONPATH=$W/site:$PYTHONPATH
  # Children that set their own PYTHONPATH (a test does) must still see the wheels.
  PTH=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gpucc-validate-wheels.pth
  echo "$W/site" >"$PTH" && echo "wheels visible to every process through $PTH" >>"$SETUP_LOG"
else
  record wheels ok 0 "none in $WHEELS"
fi
if ! wanted project; then
  record project not-asked 0
elif [ "$FAKE" = 1 ]; then
  dry project "the dry run uses the project as installed"
elif step project 120 380 "$SETUP_LOG" "$PY" -m pip install -q --no-index --no-deps \
  --no-build-isolation -e .; then
  finish project
fi
OPTIONAL=()
[ "$FAKE" = 1 ] && OPTIONAL=(--optional cupy)
if step imports 30 370 "$SETUP_LOG" "$PY" benchmarks/gpu_report.py imports "${OPTIONAL[@]}"; then
  finish imports
fi

# --- 3. the static model, in the background while the GPU steps run ------------------------------
MODEL_PID=
NVCC=$(find_tool nvcc) || NVCC=
if [ -n "$NVCC" ]; then # sass_model.py finds nvcc and nvdisasm on PATH
  CUDA_BIN=$(dirname "$NVCC")
  PATH=$CUDA_BIN:$PATH
  export PATH
fi
if ! wanted static-model; then
  record static-model not-asked 0
elif [ -n "$NVCC" ]; then
  (
    timeout 150 "$PY" benchmarks/sass_model.py --json >"$W/model.json" 2>"$W/model.err" &&
      timeout 150 "$PY" benchmarks/sass_model.py >"$W/model.txt" 2>>"$W/model.err"
  ) &
  MODEL_PID=$!
  MODEL_T0=$SECONDS
elif [ "$FAKE" = 1 ]; then
  dry static-model "nvcc not found"
else
  record static-model MISSING 0 "nvcc not found"
fi

# --- 4. smoke ------------------------------------------------------------------------------------
SMOKE=$OUT/smoke.log
if step smoke 150 320 "$SMOKE" "$PY" benchmarks/gpu_smoke.py smoke --cubin "$W/aesgcm_nvrtc.cubin"; then
  finish smoke "$(grep -c '^RESULT' "$SMOKE") findings"
fi

# --- 5. the GPU test suite: every module with GPU tests ----------------------------------------
PYT=$OUT/pytest.log
mapfile -t GPU_TESTS < <(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu|pytestmark = pytest\.mark\.gpu' tests)
if [ "$FAKE" = 1 ]; then
  PYENV=(env GPUCC_GPU_TESTS_ON_FAKE=1)
  GPU_TESTS=(tests/gpu/test_gpu_staging.py) # the module that runs on the fake
  ALLOW='set GPUCC_GPU_BIG=1|needs two GPUs|PyTorch'
else
  PYENV=(env GPUCC_GPU_BIG=1)
  # a CUDA build of PyTorch is too large to carry: its DDP test may skip
  ALLOW='needs two GPUs|PyTorch is not installed|PyTorch build has no CUDA'
fi
if step pytest-gpu 200 240 "$PYT" "${PYENV[@]}" "$PY" -m pytest -m gpu -p no:cacheprovider -rs \
  --durations=15 --junitxml="$W/pytest.xml" "${GPU_TESTS[@]}"; then
  echo "### verdict (a skip not matching /$ALLOW/ is a failure)" >>"$PYT"
  "$PY" benchmarks/gpu_report.py junit "$W/pytest.xml" --allow-skip "$ALLOW" >"$W/junit.txt" 2>&1
  JRC=$?
  cat "$W/junit.txt" >>"$PYT"
  NOTE="$(head -n 1 "$W/junit.txt") (${GPU_TESTS[*]##*/})"
  if [ "$STEP_VERDICT" = ok ] && [ "$JRC" -ne 0 ]; then
    downgrade pytest-gpu "$NOTE"
  else
    finish pytest-gpu "$NOTE"
  fi
fi

# --- 6. model hashing: the benchmark's GPU rows ---------------------------------------------------
ML=$OUT/model.log
if [ "$FAKE" = 1 ]; then
  MODEL_ARGS=(--size-mib 16 --files 2 --repeat 1)
else
  MODEL_ARGS=(--size-mib 1024 --files 8 --repeat 3)
fi
if step bench-model 90 200 "$ML" "$PY" benchmarks/bench_model.py "${MODEL_ARGS[@]}" --dir "$W"; then
  if [ "$FAKE" != 1 ] && [ "$STEP_VERDICT" = ok ] && ! grep -q '^gpu sha256' "$ML"; then
    downgrade bench-model "no GPU rows: the hash kernels were not usable"
  else
    finish bench-model
  fi
fi

# --- 6b. gradient sealing: the message kernels on DDP-shaped batches -----------------------------
DL=$OUT/ddp.log
DDP_ARGS=()
[ "$FAKE" = 1 ] && DDP_ARGS=(--buckets "1MB,4MB" --ranks "2,4" --repeat 1)
if step bench-ddp 90 180 "$DL" "$PY" benchmarks/bench_ddp_gpu.py "${DDP_ARGS[@]}" --json "$W/ddp.json"; then
  if [ "$STEP_VERDICT" = ok ] && grep -q '^no GPU:' "$DL"; then
    downgrade bench-ddp "$(grep -m 1 '^no GPU:' "$DL")"
  else
    finish bench-ddp
  fi
fi

# the static model is needed from here on
if [ -n "$MODEL_PID" ]; then
  wait "$MODEL_PID"
  MRC=$?
  if [ "$MRC" -eq 0 ]; then
    record static-model ok $((SECONDS - MODEL_T0)) "(background)"
  else
    record static-model "FAILED($MRC)" $((SECONDS - MODEL_T0)) "$(tail -n 1 "$W/model.err")"
  fi
fi

# --- 7. Nsight Compute ---------------------------------------------------------------------------
NCU_TXT=$OUT/ncu.txt
{
  echo "== static model of gcm_chunks (nvcc build)"
  if [ -s "$W/model.txt" ]; then
    cat "$W/model.txt"
  else
    echo "not available"
    cat "$W/model.err" 2>/dev/null
  fi
  if [ -s "$W/aesgcm_nvrtc.cubin" ]; then
    echo
    echo "== static model of gcm_chunks as NVRTC built it at run time"
    timeout 120 "$PY" benchmarks/sass_model.py --cubin "$W/aesgcm_nvrtc.cubin" 2>&1
  fi
} >>"$NCU_TXT"
NCU=$(find_tool ncu) || NCU=
if ! wanted ncu; then
  record ncu not-asked 0
elif [ "$FAKE" = 1 ]; then
  dry ncu
elif [ -z "$NCU" ]; then
  record ncu MISSING 0 "ncu not found"
elif [ "${STATUS[smoke]:-}" != ok ] && [ "${STATUS[smoke]:-}" != not-asked ]; then
  record ncu NOT-RUN 0 "the smoke step failed"
else
  NCU_ARGS=(--clock-control none --target-processes all -k 'regex:^gcm_(chunks|finalize)$' --set full -f
    -o "$W/ncu")
  if step ncu 120 140 "$W/ncu_run.log" "$NCU" "${NCU_ARGS[@]}" --nvtx --nvtx-include 'gv-measure/' -c 4 \
    "$PY" benchmarks/gpu_smoke.py ncu; then
    if grep -q 'No kernels were profiled' "$W/ncu_run.log" && [ "$(left)" -gt 200 ]; then
      echo "### no kernel inside the NVTX range: profiling every launch instead" >>"$W/ncu_run.log"
      step ncu 90 140 "$W/ncu_run.log" "$NCU" "${NCU_ARGS[@]}" -c 16 "$PY" benchmarks/gpu_smoke.py ncu
    fi
    {
      echo
      echo "== ncu run"
      tail -n 30 "$W/ncu_run.log"
      if [ -f "$W/ncu.ncu-rep" ]; then
        timeout 60 "$NCU" --import "$W/ncu.ncu-rep" --page raw --csv >"$W/ncu_raw.csv" 2>&1
        echo
        echo "== measured beside the static model; selected raw metrics"
        "$PY" benchmarks/gpu_report.py ncu "$W/ncu_raw.csv" --model "$W/model.json"
        echo
        echo "== details"
        timeout 60 "$NCU" --import "$W/ncu.ncu-rep" --page details 2>&1
      fi
    } >>"$NCU_TXT" 2>&1
    if [ "$STEP_VERDICT" = ok ] && [ ! -f "$W/ncu.ncu-rep" ]; then
      downgrade ncu "no report written"
    else
      finish ncu
    fi
  fi
fi

# --- 8. compute-sanitizer on a small staging run ----------------------------------------------
SAN=$OUT/sanitizer.log
CSAN=$(find_tool compute-sanitizer) || CSAN=
for tool in memcheck racecheck; do
  name=san-$tool
  if ! wanted "$name"; then
    record "$name" not-asked 0
    continue
  fi
  if [ "$FAKE" = 1 ]; then
    # the driver itself still runs, on the fake
    if step "$name" 60 60 "$SAN" "$PY" benchmarks/gpu_smoke.py small "$W/san-$tool"; then
      finish "$name" "dry run: the small run without the sanitizer"
    fi
    continue
  fi
  if [ -z "$CSAN" ]; then
    record "$name" MISSING 0 "compute-sanitizer not found"
    continue
  fi
  reserve=60
  [ "$tool" = memcheck ] && reserve=100
  if step "$name" 90 "$reserve" "$SAN" "$CSAN" --tool "$tool" --error-exitcode 97 --print-limit 30 \
    "$PY" benchmarks/gpu_smoke.py small "$W/san-$tool"; then
    finish "$name" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$SAN" | tail -n 1 | sed 's/^=* *//')"
  fi
done

# --- 9. the benchmark behind its correctness gate ------------------------------------------------
BL=$OUT/bench.log
if ! wanted bench-gpu; then
  record bench-gpu not-asked 0
elif [ "$FAKE" = 1 ]; then
  dry bench-gpu
elif step bench-gpu 600 5 "$BL" "$PY" benchmarks/bench_gpu.py --check --size 4GiB \
  --chunk-sizes 4MiB,64KiB,16MiB --repeat 3 --json "$W/bench.json" --tmp "$W"; then
  if [ -s "$W/bench.json" ]; then
    {
      echo "### bench.json"
      cat "$W/bench.json"
    } >>"$BL"
  fi
  if [ "$STEP_VERDICT" = ok ] && grep -q '^no GPU:' "$BL"; then
    downgrade bench-gpu "$(grep -m 1 '^no GPU:' "$BL")"
  elif grep -q 'correctness tests failed' "$BL"; then
    finish bench-gpu "the --check gate failed: nothing timed"
  else
    finish bench-gpu
  fi
fi

# --- the summary ---------------------------------------------------------------------------------
if [ -n "$SAMPLER" ]; then
  kill "$SAMPLER" 2>/dev/null
  wait "$SAMPLER" 2>/dev/null
  {
    echo
    echo "== sampled during the run"
    "$PY" benchmarks/gpu_report.py clocks "$W/clocks.csv"
  } >>"$SMI" 2>&1
fi
section() {
  echo
  echo "== $1"
}
{
  echo "gpucc GPU validation"
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(git status --porcelain 2>/dev/null | wc -l | tr -d ' ') changed paths"
  if [ "$FAKE" = 1 ]; then echo "mode: dry run (tests/support/fake_cupy.py)"; else echo "mode: device"; fi
  echo "budget: ${BUDGET}s, elapsed $(($(now) - START))s"
  section "steps"
  printf '%-14s %-12s %6s  %s\n' step status time note
  cat "$TABLE"
  section "device"
  head -n 2 "$SMI" | tail -n 1
  grep -E '^RESULT (device|versions|cuda|nvrtc):' "$SMOKE" | sed 's/^RESULT /  /'
  grep -E '^SM clock under load' "$SMI" | sed 's/^/  /'
  section "smoke: builds, known answers, ceilings, kernels alone"
  grep -E '^RESULT ' "$SMOKE" | grep -vE '^RESULT (device|versions|cuda|nvrtc):' | sed 's/^RESULT /  /'
  section "pytest -m gpu"
  [ -f "$W/junit.txt" ] && sed 's/^/  /' "$W/junit.txt"
  section "ncu beside the static model"
  grep -E '^(metric \||gpu__time_duration\.sum|launch__grid_size|launch__block_size|launch__registers_per_thread|smsp__issue_active)' \
    "$NCU_TXT" | sed 's/^/  /'
  sed -n '/^gcm_chunks, 128 MiB/,/^predicted busy =/p' "$NCU_TXT" | sed 's/^/  /'
  grep -E '^bound with the per-tile overhead' "$NCU_TXT" | sed 's/^/  static: /'
  section "compute-sanitizer"
  grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|SMALL RUN OK|Error' "$SAN" | head -n 12 | sed 's/^/  /'
  section "model hashing (bench_model.py)"
  sed -n '/^operation/,/^###/p' "$ML" | grep -v '^###' | sed 's/^/  /'
  section "gradient sealing (bench_ddp_gpu.py, GB/s)"
  sed -n '/^  *bucket/,/^GB\/s of plaintext/p' "$DL" | sed 's/^/  /'
  section "bench_gpu.py (GB/s, x line rate)"
  awk '/^GB\/s \(x line rate\)/{on=1} on' "$BL" | sed 's/^/  /'
  grep -E 'correctness tests failed|^no GPU:' "$BL" | sed 's/^/  /'
  if compgen -G "$W/why-*.txt" >/dev/null; then
    section "why steps failed (the last lines of their output; the whole of it in the logs)"
    for f in "$W"/why-*.txt; do
      n=${f##*/why-}
      echo "-- ${n%.txt}"
      sed 's/^/  /' "$f"
    done
  fi
  section "files"
  echo "  $(find "$OUT" -maxdepth 1 -type f -printf '%f ')"
  echo
  if [ "${#FAILED[@]}" -eq 0 ]; then
    if [ "$FAKE" = 1 ]; then echo "OVERALL: DRY RUN PASSED"; else echo "OVERALL: PASSED"; fi
  else
    echo "OVERALL: FAILED (${FAILED[*]})"
  fi
} >"$SUMMARY" 2>&1

[ -n "$PTH" ] && rm -f "$PTH"
rm -rf "$W"
cat "$SUMMARY"
[ "${#FAILED[@]}" -eq 0 ]

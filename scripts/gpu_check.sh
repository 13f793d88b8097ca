#!/usr/bin/env bash
# The CUDA path of ftrain's checkpointing, checked on one GPU machine in one short run (a few minutes).
#
# Pinned host staging with non-blocking device-to-host copies, the CUDA RNG state in the checkpoint, and nccl for
# training beside a gloo group for checkpoint collectives only run where there is a GPU. This runs them:
#   (a) sync    the reference trainer (85m model, 40 steps, a save every 10), sync saves: its final digest
#   (b) async   the same with --async-ckpt: the digest must equal (a)'s
#   (c) resume  an async run SIGKILLed (FTRAIN_KILL_AT=fanout:30) once its step-30 files are durable, before it is sealed, then run
#               again: it must resume from step 20 and end on (a)'s digest (dropout draws from the CUDA RNG, so
#               the resumed steps match only if the checkpoint restored it)
#   (d) bench   scripts/bench_checkpoint.py --device cuda (85m, 3 rounds): every figure; its targets are
#               reported, not judged (the check is that it runs on the GPU)
# One rank per GPU, at most 2 (nccl refuses two ranks on one device). Everything goes under one temporary
# directory: removed when every check passed, kept and named otherwise.
#
# Usage: scripts/gpu_check.sh [--cpu]
#   --cpu  dry run of the same steps on CPU at tiny sizes (debug model, 1 bench round), for checking the script
#          itself on a machine without a GPU
# Environment:
#   FTRAIN_GPU_CHECK_PYTHON   the interpreter (default: .venv/bin/python; when missing, `make` creates .venv,
#                             with torch==2.13.0 from PyPI, which is the CUDA build on a GPU machine)
#   FTRAIN_GPU_CHECK_TIMEOUT  seconds for all the checks together (default 450; creating .venv not counted)
# Exit: 0 every check passed; 1 one failed or ran out of time; 2 no CUDA device visible, or usage.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
CPU=0
case "$*" in
    "") ;;
    --cpu) CPU=1 ;;
    *) echo "usage: scripts/gpu_check.sh [--cpu]" >&2; exit 2 ;;
esac

GPUS=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)
if (( CPU == 0 && GPUS == 0 )); then
    echo "gpu_check: no CUDA device visible (nvidia-smi is missing or lists none); --cpu dry-runs the steps on CPU" >&2
    exit 2
fi

PY=${FTRAIN_GPU_CHECK_PYTHON:-$ROOT/.venv/bin/python}
LIMIT=${FTRAIN_GPU_CHECK_TIMEOUT:-450}
for name in $(compgen -e); do  # nothing inherited steers the jobs: no run id, no log, no injected fault
    if [[ $name == FTRAIN_* ]]; then unset "$name"; fi
done
if [[ ! -x $PY ]]; then
    echo "== setup: creating .venv with make (downloads torch) =="
    timeout 1200 make -s .venv/bin/ftrain
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if (( CPU )); then
    export CUDA_VISIBLE_DEVICES=""  # the CPU path even on a GPU machine
fi

INFO=$("$PY" -c '
import platform, torch
n = torch.cuda.device_count()
names = ", ".join(torch.cuda.get_device_name(i) for i in range(n)) or "none"
print(n)
print(f"Python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), GPUs: {names}")
')
VISIBLE=${INFO%%$'\n'*}
if (( CPU )); then
    NPROC=1 MODEL=debug DEVICE=cpu REPEATS=1
elif (( VISIBLE == 0 )); then
    echo "gpu_check: torch sees no CUDA device (${INFO#*$'\n'}): a CPU build of torch, or CUDA_VISIBLE_DEVICES" >&2
    exit 2
else
    NPROC=$(( VISIBLE < 2 ? VISIBLE : 2 )) MODEL=85m DEVICE=cuda REPEATS=3
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ftrain-gpu-check.XXXXXX")
export TMPDIR=$WORK/tmp FTRAIN_HOME=$WORK/home  # staging directories, torch's and ftrain's files: all in WORK
mkdir -p "$TMPDIR" "$WORK/logs"
declare -A RESULT=()
ORDER=(sync async resume bench)
JOB=
finish() {  # on exit, however it comes: every check's line, then the verdict
    local failed=0 check
    echo
    echo "== summary ($DEVICE, $NPROC rank(s), model $MODEL; $(( SECONDS )) s in all) =="
    for check in "${ORDER[@]}"; do
        printf '%-7s %s\n' "$check" "${RESULT[$check]:-FAIL (not run)}"
        [[ ${RESULT[$check]:-FAIL} == PASS* ]] || failed=1
    done
    if (( failed )); then
        echo "gpu_check: FAIL; logs and checkpoints kept in $WORK"
        exit 1
    fi
    rm -rf "$WORK"
    echo "gpu_check: PASS"
}
on_signal() {
    if [[ -n $JOB ]]; then kill -TERM "$JOB" 2>/dev/null || true; fi
    exit 130
}
trap on_signal INT TERM
trap finish EXIT

DEADLINE=$(( SECONDS + LIMIT ))
# bounded LOG CMD...: CMD, its output in LOG, killed when the checks' time is up; returns its exit status.
# In the background so that a signal to this script reaches it through on_signal.
bounded() {
    local log=$1 budget=$(( DEADLINE - SECONDS )) rc=0
    shift
    if (( budget <= 0 )); then
        echo "gpu_check: out of time (FTRAIN_GPU_CHECK_TIMEOUT=$LIMIT)" >"$log"
        return 124
    fi
    timeout -k 10 "$budget" "$@" >"$log" 2>&1 &
    JOB=$!
    { wait "$JOB" || rc=$?; } 2>/dev/null  # a kill is reported by the caller, not as bash's "Killed" line
    JOB=
    return "$rc"
}

# train NAME KILL_AT [FLAGS...]: one job of the reference trainer, checkpointing to $WORK/NAME, its output in
# logs/NAME.log (logs/NAME-killed.log with a kill injected); in a session of its own, as FTRAIN_KILL_AT signals
# torchrun's process group. Prints its wall time and exit status.
train() {
    local name=$1 kill_at=$2 start=$EPOCHREALTIME rc=0
    shift 2
    bounded "$WORK/logs/$name${kill_at:+-killed}.log" env ${kill_at:+FTRAIN_KILL_AT=$kill_at} setsid "$PY" -m torch.distributed.run \
        --standalone --nproc-per-node "$NPROC" -m ftrain.examples.train --ckpt-dir "$WORK/$name" \
        --model "$MODEL" --train-iters 40 --save-interval 10 "$@" || rc=$?
    echo "   wall $(seconds_since "$start") s, exit $rc${kill_at:+ (FTRAIN_KILL_AT=$kill_at)}"
    return "$rc"
}

seconds_since() {
    local us=$(( ${EPOCHREALTIME/./} - ${1/./} ))
    printf '%d.%01d' $(( us / 1000000 )) $(( us % 1000000 / 100000 ))
}

digest() {  # the FINAL digest a job printed, or nothing
    sed -n 's/^FINAL step=[0-9]* params_sha256=\([0-9a-f]\{64\}\)$/\1/p' "$WORK/logs/$1.log" | tail -1
}

# figures NAME: what a job's rank 0 measured (its metrics) and the checkpoints it left, and its output's lines
# that matter (FINAL, RESUMED, warnings of kernels without a deterministic implementation).
figures() {
    grep -E '^(FINAL|RESUMED) ' "$WORK/logs/$1.log" | sed 's/^/   /' || true
    local nondeterministic
    nondeterministic=$(grep -c 'does not have a deterministic implementation' "$WORK/logs/$1.log" || true)
    (( ${nondeterministic:-0} == 0 )) || echo "   WARNING: $nondeterministic warnings of a kernel without a deterministic implementation"
    "$PY" - "$WORK/$1" <<'EOF' || echo "   (no figures: see the error above)"
import statistics
import sys
from pathlib import Path

import msgspec

from ftrain.train.metrics import metrics_path
from workers.layout import complete_steps, step_dir

ckpt = Path(sys.argv[1])
path = metrics_path(ckpt / "metrics", 0)
if not path.exists():
    print("   no metrics: the job never started training")
    sys.exit()
records = []
for line in path.read_bytes().splitlines():
    try:
        records.append(msgspec.json.decode(line))
    except msgspec.DecodeError:
        pass  # a line torn by a kill
steps = [r for r in records if "train/dt" in r]
if steps:
    print(
        f"   rank 0: {len(steps)} steps logged, median step {statistics.median(r['train/dt'] for r in steps) * 1e3:.1f} ms, "
        f"loss {steps[0]['train/loss']:.3f} -> {steps[-1]['train/loss']:.3f}"
    )
for r in records:
    if "train/restart_seconds" in r:
        print(f"   resumed: first step done {r['train/restart_seconds']:.1f} s after start, {r['train/lost_steps']} steps lost")
    saved = {k.removeprefix("train/ckpt_"): v for k, v in r.items() if k.startswith("train/ckpt_")}
    if saved:
        what = ", ".join(f"{k.removesuffix('_seconds')} {v:.3f} s" for k, v in saved.items())
        print(f"   save at step {r['train/iter']}: {what}" if "train/iter" in r else f"   at the end: {what}")
complete = complete_steps(ckpt)
if complete:
    files = [f for f in step_dir(ckpt, complete[0]).iterdir() if f.is_file()]
    size = sum(f.stat().st_size for f in files) / 1e9
    print(f"   complete checkpoints {complete}; step-{complete[0]}: {size:.3f} GB in {len(files)} files")
EOF
}

# verdict CHECK NAME CONDITIONS REASON: the check's result line, PASS when every condition held (CONDITIONS is
# one 0 or 1 per condition); a failure shows the end of job NAME's output.
verdict() {
    local check=$1 name=$2 conditions=$3 reason=$4
    if [[ $conditions != *0* ]]; then
        RESULT[$check]="PASS ($reason)"
    else
        RESULT[$check]="FAIL ($reason)"
        echo "   --- the end of $WORK/logs/$name.log ---"
        tail -n 30 "$WORK/logs/$name.log" | sed 's/^/   | /'
    fi
}

same() {  # 1 if digest $1 is (a)'s, and (a) printed one
    [[ -n $REFERENCE && $1 == "$REFERENCE" ]] && echo 1 || echo 0
}

echo "== gpu_check on $DEVICE: $NPROC rank(s), model $MODEL, checks' time limit $LIMIT s, work in $WORK =="
echo "   ${INFO#*$'\n'}"
if (( ! CPU )); then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/   /' || true
fi

echo
echo "== (a) sync: the reference trainer, sync saves, to step 40 =="
rc=0; train sync "" || rc=$?
figures sync
REFERENCE=$(digest sync)
verdict sync sync "$(( rc == 0 ))$(same "$REFERENCE")" "exit $rc, digest ${REFERENCE:-none}"

echo
echo "== (b) async: the same with --async-ckpt; the digest must equal (a)'s =="
rc=0; train async "" --async-ckpt || rc=$?
figures async
GOT=$(digest async)
verdict async async "$(( rc == 0 ))$(same "$GOT")" "exit $rc, digest ${GOT:-none}"

echo
echo "== (c) resume: async, SIGKILLed once the step-30 files are durable, before the seal, then run again =="
rc=0; train resume fanout:30 --async-ckpt || rc=$?
KILLED=$rc
echo "   -- the same command again --"
rc=0; train resume "" --async-ckpt || rc=$?
figures resume
GOT=$(digest resume)
FROM=$(sed -n 's/^RESUMED from step=\([0-9]*\) .*/\1/p' "$WORK/logs/resume.log" | tail -1)
verdict resume resume "$(( KILLED == 137 && rc == 0 && ${FROM:-0} == 20 ))$(same "$GOT")" \
    "killed: exit $KILLED; resumed from step ${FROM:-none}, exit $rc, digest ${GOT:-none}"

echo
echo "== (d) bench: scripts/bench_checkpoint.py --device $DEVICE --model $MODEL --repeats $REPEATS =="
start=$EPOCHREALTIME rc=0
bounded "$WORK/logs/bench.log" "$PY" scripts/bench_checkpoint.py --device "$DEVICE" --model "$MODEL" \
    --repeats "$REPEATS" --dir "$WORK/bench" || rc=$?
sed 's/^/   /' "$WORK/logs/bench.log"
echo "   wall $(seconds_since "$start") s, exit $rc"
verdict bench bench "$(( rc == 0 ))" "exit $rc"

#!/usr/bin/env bash
# One call on the lent GPU box (device tool), many benches: installs the carried wheels (.whl/), then runs
# named lanes in parallel, each lane a sequence of steps on its own GPU(s), all inside one deadline so the
# results come back even when a step overruns. Every step's stdout/stderr goes to LOGS/<step>.log, its JSON
# to RES/<step>/; both are packed into $OUT/batch.tar.gz at the end and each JSON's summary is printed.
#
# usage: bench/gpu_batch.sh 'LANE' ['LANE' ...]   LANE = "GPUS:step,step,..."  (GPUS e.g. 0 or 1 or 0,1)
#        GPU_BATCH_BUDGET_S (default 540) bounds the whole call; the device tool's own limit is 600 s.
#        EXTRACT_MODES / EXTRACT_WB_MODES: --modes of the extract / extract_wb2 steps (fsync, fsync_<N>threads,
#        no_fsync); WRITEPATH_ARGS: more arguments of write_path.py (e.g. --threads 4,8).
#        BENCH_TINY=1 adds --tiny to extract/hook/fp8 and TRAIN_ARGS goes to train_gpu.py (a CPU smoke run).
# steps: train1k train20k train_pipeline extract extract_w2 extract_wb2 extract_bs (EAGLE3OPS_BATCH_SYNC=1) extract_shm extract_w2_shm
#        extract_wall extract_wall_shm (one worker per GPU of the lane) hook fp8
#        writepath gpufree
set -u
: "${OUT:=/tmp/gpu-batch-out}"
BUDGET=${GPU_BATCH_BUDGET_S:-540}
DEADLINE=$(($(date +%s) + BUDGET))
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOGS=/tmp/gpu-batch/logs
RES=/tmp/gpu-batch/res
mkdir -p "$OUT" "$LOGS" "$RES"
cd "$ROOT" || exit 1

if [ -d .whl ] && [ ! -d /tmp/site/speculators ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$LOGS/pip.log" 2>&1 || { echo "wheel install failed"; tail "$LOGS/pip.log"; }
fi
export PYTHONPATH="/tmp/site:$ROOT/python" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# what this call runs on (a wheel that did not install shows up here, not halfway through a step)
python3 -c 'import torch, transformers, datasets, pyarrow; print("torch", torch.__version__, "transformers",
transformers.__version__, "datasets", datasets.__version__, "pyarrow", pyarrow.__version__)' 2>&1 | tail -n 2
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader

# a trainer detached by an earlier call on this box (train_gpu.py's stage ran out of time) would share the GPU
# with this call's measurements: stop them first (this box is ours alone)
pkill -f eagle3ops.speculators_shim && sleep 5
pkill -9 -f eagle3ops.speculators_shim
rm -rf /tmp/tg-[0-9]* /tmp/tp-[0-9]*

left() { echo $((DEADLINE - $(date +%s))); }

run_step() { # gpus step
  local gpus=$1 step=$2 t
  t=$(left)
  if [ "$t" -lt 25 ]; then
    echo "[$step] skipped: ${t}s left"
    return
  fi
  local r="$RES/$step"
  mkdir -p "$r"
  echo "[$step] start on GPU $gpus, ${t}s left ($(date +%T))"
  local cmd ngpus
  ngpus=$(echo "$gpus" | tr ',' '\n' | grep -c .)
  case $step in
    train1k) cmd=(python3 bench/train_gpu.py --stages synth-1000 --max-steps "${TRAIN_STEPS:-40}"
      --stage-timeout $((t - 40)) --work /tmp/tg-$gpus --data-root /tmp/tg-data --out "$r" ${TRAIN_ARGS:-}) ;;
    train20k) cmd=(python3 bench/train_gpu.py --stages synth-1000,synth-20000 --max-steps "${TRAIN_STEPS:-40}"
      --stage-timeout $(((t - 60) / 2)) --work /tmp/tg-$gpus --data-root /tmp/tg-data --out "$r" ${TRAIN_ARGS:-}) ;;
    train_pipeline) cmd=(python3 bench/train_gpu.py --stages pipeline --stage-timeout $((t - 60))
      --work /tmp/tp-$gpus --out "$r" ${TRAIN_ARGS:-}) ;;
    extract) cmd=(python3 bench/extract_throughput.py --out "$r" --rows "${EXTRACT_ROWS:-320}" --workers 1
      --modes "${EXTRACT_MODES:-fsync,fsync_4threads,no_fsync}" ${EXTRACT_ARGS:-}) ;;
    extract_w2) cmd=(python3 bench/extract_throughput.py --out "$r" --rows "${EXTRACT_ROWS:-320}" --workers 2
      --modes "${EXTRACT_MODES:-fsync,fsync_4threads,no_fsync}") ;;
    hook) cmd=(python3 bench/sglang_hook_gpu.py --out "$r") ;;
    fp8) cmd=(python3 bench/fp8_gpu.py --out "$r") ;;
    # durable-write variants on this box's disk, then the end-to-end effect of the best CPU candidate
    writepath) cmd=(python3 bench/write_path.py --dir /tmp/e3o-writepath --reps "${WRITEPATH_REPS:-6}"
      --writeback-mib 2 --out "$r" --suffix variants_wb2 ${WRITEPATH_ARGS:-}) ;;
    extract_wb2) cmd=(env EAGLE3OPS_WRITEBACK_MIB=2 python3 bench/extract_throughput.py --out "$r"
      --rows "${EXTRACT_ROWS:-640}" --workers 1 --modes "${EXTRACT_WB_MODES:-fsync_4threads}" ${EXTRACT_ARGS:-}) ;;
    extract_bs) cmd=(env EAGLE3OPS_BATCH_SYNC=1 python3 bench/extract_throughput.py --out "$r"
      --rows "${EXTRACT_ROWS:-640}" --workers 1 --modes "${EXTRACT_WB_MODES:-fsync_4threads}" ${EXTRACT_ARGS:-}) ;;
    # worker scaling where the disk is not the limit: the output in RAM (/dev/shm), 1 then 2 workers
    extract_shm) cmd=(python3 bench/extract_throughput.py --out "$r" --work /dev/shm/e3o-x1
      --rows "${EXTRACT_ROWS:-320}" --workers 1 --modes fsync_4threads) ;;
    # one worker per GPU of the lane (e.g. "0,1,2,3,4,5,6,7:extract_wall,extract_wall_shm" on the 8-GPU kind)
    extract_wall) cmd=(python3 bench/extract_throughput.py --out "$r" --rows "${EXTRACT_ROWS:-640}"
      --workers "$ngpus" --modes "${EXTRACT_MODES:-fsync_4threads}") ;;
    extract_wall_shm) cmd=(python3 bench/extract_throughput.py --out "$r" --work /dev/shm/e3o-xn
      --rows "${EXTRACT_ROWS:-640}" --workers "$ngpus" --modes fsync_4threads) ;;
    extract_w2_shm) cmd=(python3 bench/extract_throughput.py --out "$r" --work /dev/shm/e3o-x2
      --rows "${EXTRACT_ROWS:-320}" --workers 2 --modes fsync_4threads) ;;
    gpufree) cmd=(env OUT="$r" python3 bench/gpu_free_release.py) ;;
    *)
      echo "[$step] unknown step"
      return
      ;;
  esac
  case $step in extract* | hook | fp8) [ -n "${BENCH_TINY:-}" ] && cmd+=(--tiny) ;; esac
  case $step in writepath) [ -n "${BENCH_TINY:-}" ] && cmd+=(--run-mib 64 --mib 8 --threads 2 --reps 1) ;; esac
  CUDA_VISIBLE_DEVICES=$gpus timeout --kill-after=15 "$((t - 5))" "${cmd[@]}" >"$LOGS/$step.log" 2>&1
  echo "[$step] rc=$? ($(date +%T), $(left)s left)"
}

lane() { # "GPUS:step,step"
  local gpus=${1%%:*} steps=${1#*:} s
  IFS=, read -ra list <<<"$steps"
  for s in "${list[@]}"; do run_step "$gpus" "$s"; done
}

for l in "$@"; do lane "$l" & done
wait

for f in "$RES"/*/*.json; do
  [ -e "$f" ] || continue
  echo "== $f"
  python3 - "$f" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
def flat(x, p=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from flat(v, f"{p}{k}.")
    elif not isinstance(x, list) or len(x) < 8:
        yield p[:-1], x
for k, v in flat(d):
    if "log_tail" in k:
        continue
    s = str(v)
    print(f"  {k} = {s[:300]}")
EOF
done
for f in "$LOGS"/*.log; do
  echo "== tail $f"
  tail -n 6 "$f" | cut -c1-400
done
tar -czf "$OUT/batch.tar.gz" -C /tmp/gpu-batch logs res 2>/dev/null
ls -la "$OUT"

#!/usr/bin/env bash
# The live SGLang run on the lent H200 box (issues #17 and #18), as a few device calls in a row.
# The box keeps what a call installed only while it stays warm (30 s between calls), so every call is short
# to type and the long work runs detached (setsid) between them, polled by the next call.
#
#   call 1  bench/sglang_live.sh carry1   carry .sgl1                       (the wheelhouse, chunk 1)
#   call 2  bench/sglang_live.sh carry2   carry .sgl2                       (chunk 2)
#   call 3  bench/sglang_live.sh carry3   carry .devcarry/a                 (SmolLM2 GGUF part 1, trainer wheels)
#   call 4  bench/sglang_live.sh start    carry .devcarry/b                 (GGUF part 2, ShareGPT subset, MT-bench);
#                                         installs everything, starts bench/sglang_live_lanes.py detached, then polls
#   call 5+ bench/sglang_live.sh poll                                       (polls; packs $OUT when it ends)
# .sgl1/.sgl2: ../shared/gpu-box/sglang-wheelhouse.sh; .devcarry: bench/sglang_live_carry.sh (both git-ignored).
# LIVE_POLL_S bounds one poll (default 540 s, under the tool's 600 s); LIVE_ARGS go to sglang_live_lanes.py.
set -u
: "${OUT:=/tmp/sglang-live-out}"
C=/tmp/e3c S=/tmp/sglsite W=/tmp/live
mkdir -p "$C" "$OUT" "$W"
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD

pack() {  # results and logs back through $OUT (at most 8 files, 16 MiB each)
  # results, and the benchmark phase's own report (JSON, markdown, PNG) from each playbook run
  [ -d "$W/res" ] && (cd "$W" && tar czf "$OUT/res.tgz" res $(ls -d pb-*/work/benchmark demo/pb-*/work/benchmark \
    2>/dev/null) 2>/dev/null)
  [ -d "$W/logs" ] && (cd "$W" && tar czf "$OUT/logs.tgz" --exclude='*.safetensors' logs 2>/dev/null)
  # lane demo (#17) writes its result.json stage by stage: bring it back even while it still runs
  [ -d "$W/demo" ] && (cd "$W" && tar czf "$OUT/demo.tgz" --exclude='*.safetensors' --exclude='*.pt' \
    --exclude='hidden_states' --exclude='models' demo/result.json demo/logs 2>/dev/null)
  [ -f "$W/summary.json" ] && cp "$W/summary.json" "$OUT/"
  ls -la "$OUT"
}

poll() {
  local until=$(($(date +%s) + ${LIVE_POLL_S:-540}))
  while [ "$(date +%s)" -lt "$until" ]; do
    if [ -f "$W/done" ]; then
      echo "== finished"
      tail -n 60 "$W/live.log"
      pack
      return 0
    fi
    sleep 10
  done
  echo "== still running ($(date +%T)); last lines:"
  tail -n 40 "$W/live.log"
  pack
}

case "${1:-}" in
  carry1) cp .sgl1/*.whl "$C/" && ls "$C" | wc -l; nvidia-smi -L; df -h /tmp /dev/shm; free -g | head -2 ;;
  carry2) cp .sgl2/*.whl "$C/" && ls "$C" | wc -l ;;
  carry3) cp .devcarry/a/gguf.* "$C/" && cp .devcarry/a/whl/*.whl "$C/" && ls "$C" | wc -l ;;
  start)
    ls "$C"/gguf.aa >/dev/null 2>&1 || { echo "carry3 lost: the box was not kept warm"; exit 3; }
    mkdir -p /tmp/assets
    cat "$C"/gguf.aa .devcarry/b/gguf.ab > /tmp/assets/SmolLM2-135M-Instruct.Q4_1.gguf
    cp .devcarry/b/sharegpt* .devcarry/b/mtbench_question.jsonl /tmp/assets/
    sha256sum /tmp/assets/*.gguf
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$S" "$C"/*.whl \
      > "$W/pip.log" 2>&1 || { echo "pip install failed"; tail -20 "$W/pip.log"; exit 4; }
    cp bench/box_sitecustomize.py "$S/sitecustomize.py"  # transformers 5.17 vs sglang 0.5.17
    export PYTHONPATH="$S:$ROOT/python" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
      HF_DATASETS_OFFLINE=1 SGLANG_ENABLE_JIT_DEEPGEMM=0 TVM_FFI_CACHE_DIR=/tmp/tvmffi TOKENIZERS_PARALLELISM=false
    python3 -c "import sglang, sgl_kernel, speculators, datasets, torch; print('sglang', sglang.__version__, 'speculators', speculators.__version__, 'torch', torch.__version__)" 2>&1 | tail -2
    # byte-compile SGLang on all cores while the run converts the model (the first server's imports then read .pyc)
    (nohup python3 -m compileall -q -j 0 "$S/sglang" > "$W/compileall.log" 2>&1 &)
    python3 -c "import deep_gemm; print('deep_gemm', deep_gemm.__file__)" 2>&1 | tail -1
    rm -f "$W/done"
    # shellcheck disable=SC2086
    setsid bash -c "python3 bench/sglang_live_lanes.py --work $W ${LIVE_ARGS:-} > $W/live.log 2>&1; touch $W/done" \
      < /dev/null > /dev/null 2>&1 &
    sleep 5
    poll
    ;;
  poll) poll ;;
  *) echo "usage: $0 carry1|carry2|carry3|start|poll"; exit 2 ;;
esac

#!/usr/bin/env bash
# The Kimi-K2.5-format fixture through the box's SGLang (bench/kimi_live.py), as device calls in a row: the box
# keeps what a call installed only while it stays warm (30 s between calls).
#
#   call 1  bench/kimi_live.sh carry1   carry .devcarry/c1    (wheels, chunk 1; copied to /tmp/e3c)
#   call 2  bench/kimi_live.sh carry2   carry .devcarry/c2    (chunk 2)
#   call 3  bench/kimi_live.sh start    carry .devcarry/c3    (chunk 3); installs all into /tmp/sglsite, starts
#                                                              bench/kimi_live.py detached, then polls
#   call 4+ bench/kimi_live.sh poll                            (polls; packs $OUT when it ends)
# The three chunks (each <= 43 MiB, so a tree up to ~20 MiB travels beside each) hold the SGLang 0.5.17
# wheelhouse of ../shared/gpu-box/sglang-wheelhouse.sh (compressed-tensors included) plus speculators, datasets,
# hs-connectors, tiktoken and sgl-deep-gemm for Python 3.12; all git-ignored. KIMI_ARGS go to kimi_live.py.
set -u
: "${OUT:=/tmp/kimi-live-out}"
C=/tmp/e3c S=/tmp/sglsite W=/tmp/kimi
mkdir -p "$C" "$OUT" "$W"
cd "$(dirname "$0")/.." || exit 1

pack() {
  [ -d "$W/res" ] && (cd "$W" && tar czf "$OUT/res.tgz" res 2>/dev/null)
  [ -d "$W/logs" ] && (cd "$W" && tar czf "$OUT/logs.tgz" logs 2>/dev/null)
  [ -f "$W/summary.json" ] && cp "$W/summary.json" "$OUT/"
  ls -la "$OUT"
}

poll() {  # packs every 60 s too: a call cut short (the session's device time spent) still brings results back
  local until=$(($(date +%s) + ${LIVE_POLL_S:-540})) packed=$(date +%s)
  while [ "$(date +%s)" -lt "$until" ]; do
    if [ -f "$W/done" ]; then echo "== finished"; tail -n 40 "$W/live.log"; pack; return 0; fi
    if [ $(($(date +%s) - packed)) -ge 60 ]; then pack > /dev/null; packed=$(date +%s); fi
    sleep 10
  done
  echo "== still running ($(date +%T)); last lines:"; tail -n 30 "$W/live.log"; pack
}

case "${1:-}" in
  carry1) cp .devcarry/c1/*.whl "$C/" && ls "$C" | wc -l; nvidia-smi -L; python3 -c "import pyarrow" && echo pyarrow ok ;;
  carry2) cp .devcarry/c2/*.whl "$C/" && ls "$C" | wc -l ;;
  start)
    cp .devcarry/c3/*.whl "$C/"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$S" "$C"/*.whl \
      > "$W/pip.log" 2>&1 || { echo "pip install failed"; tail -20 "$W/pip.log"; exit 4; }
    cp bench/box_sitecustomize.py "$S/sitecustomize.py"  # transformers 5.17 vs sglang 0.5.17
    export PYTHONPATH="$S:$PWD/python" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
      HF_DATASETS_OFFLINE=1 SGLANG_ENABLE_JIT_DEEPGEMM=0 TVM_FFI_CACHE_DIR=/tmp/tvmffi TOKENIZERS_PARALLELISM=false
    python3 -c "import sglang, speculators, datasets, tiktoken, compressed_tensors, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)" 2>&1 | tail -2
    (nohup python3 -m compileall -q -j 0 "$S/sglang" > "$W/compileall.log" 2>&1 &)
    rm -f "$W/done"
    # shellcheck disable=SC2086
    setsid bash -c "python3 bench/kimi_live.py --work $W ${KIMI_ARGS:-} > $W/live.log 2>&1; touch $W/done" \
      < /dev/null > /dev/null 2>&1 &
    sleep 5
    poll ;;
  poll) export PYTHONPATH="$S:$PWD/python"; poll ;;
  *) echo "usage: $0 carry1|carry2|start|poll"; exit 2 ;;
esac

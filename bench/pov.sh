#!/usr/bin/env bash
# The proof-of-value run (issue #31, bench/proof_of_value.py) on the lent H200, as device calls in a row. The box keeps
# what a call installed only while it stays warm (30 s between calls): each call is issued the moment the previous
# one returns, and the long work runs detached between them, polled by the next call.
#
#   call 1  bench/pov.sh carry1   carry .sgl1    the SGLang wheelhouse, chunk 1
#   call 2  bench/pov.sh carry2   carry .sgl2    chunk 2; installs SGLang 0.5.17 (its wheelhouse also brings dill and
#                                                openai, which datasets and SpecForge import)
#   call 3  bench/pov.sh probe    carry .pov/a   trainer wheels + SpecForge, GGUF part 1; SpecForge trained through
#                                                our train phase on synthetic SmolLM2-shaped states (its rate, its
#                                                export): a SpecForge that fails, fails here, before the long run
#        or bench/pov.sh carry3   carry .pov/a   the same carry without the probe (~150 s of device time less)
#   call 4  bench/pov.sh start    carry .pov/d   GGUF part 2, the regenerated conversations, MT-bench, held-out
#                                                prompts; starts proof_of_value.py detached, polls
#   call 5+ bench/pov.sh poll                    polls; packs $OUT each time
# .pov: bench/pov_carry.sh; .sgl1/.sgl2: ../shared/gpu-box/sglang-wheelhouse.sh (all git-ignored).
# Each call's carry plus the working tree must stay under 64 MiB: bench/pov_tree.sh size says whether they do,
# and `hold` (before call 1) / `restore` (after the last poll) move the raw trainer metrics out of the tree meanwhile.
# POV_POLL_S bounds one poll (default 560 s, under the tool's 600 s); POV_ARGS go to proof_of_value.py, or to
# POV_SCRIPT (e.g. pov_equal.py: the equal-footing comparison with SpecForge, run by `start` the same way).
set -u
: "${OUT:=/tmp/pov-out}"
C=/tmp/e3c S=/tmp/sglsite E=/tmp/e3site W=/tmp/pov
mkdir -p "$C" "$OUT" "$W"
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
export PYTHONPATH="$E:$S:$ROOT/python" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 SGLANG_ENABLE_JIT_DEEPGEMM=0 TVM_FFI_CACHE_DIR=/tmp/tvmffi TOKENIZERS_PARALLELISM=false

pack() {  # results and logs of work directory $1 (default $W) back through $OUT
  local w=${1:-$W}
  [ -d "$w/res" ] && (cd "$w" && tar czf "$OUT/res.tgz" res 2>/dev/null)
  [ -d "$w/logs" ] && (cd "$w" && tar czf "$OUT/logs.tgz" --exclude='*.safetensors' logs 2>/dev/null)
  [ -f "$w/summary.json" ] && cp "$w/summary.json" "$OUT/"
  [ -f "$w/pov.log" ] && cp "$w/pov.log" "$OUT/"
  ls -la "$OUT"
}

poll() {  # packs every 120 s too: a poll cut short (the session's device time spent) still brings results back
  local until=$(($(date +%s) + ${POV_POLL_S:-560})) packed=$(date +%s)
  while [ "$(date +%s)" -lt "$until" ]; do
    if [ -f "$W/done" ]; then
      echo "== finished"
      tail -n 50 "$W/pov.log"
      pack
      return 0
    fi
    if [ $(($(date +%s) - packed)) -ge 120 ]; then pack > /dev/null; packed=$(date +%s); fi
    sleep 10
  done
  echo "== still running ($(date +%T)); last lines:"
  tail -n 30 "$W/pov.log"
  pack
}

install_trainers() {  # the trainers' wheels (speculators, datasets, SpecForge, pydantic) into $E
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$E" .pov/a/whl/*.whl \
    > "$W/pip-trainers.log" 2>&1 || { echo "pip install (trainers) failed"; tail -20 "$W/pip-trainers.log"; exit 4; }
}

sitecustomize() {  # transformers 5.17 already registers qwen3_asr; sglang 0.5.17 registers it again
  cp bench/box_sitecustomize.py "$S/sitecustomize.py"
}

case "${1:-}" in
  probe)
    cp .pov/a/gguf.aa "$C/"
    install_trainers
    nvidia-smi -L; df -h /tmp /dev/shm | tail -2; free -g | head -2; nproc
    python3 -c "import specforge, speculators, datasets, torch, triton; print('specforge', specforge.__version__ if hasattr(specforge, '__version__') else '?', 'speculators', speculators.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tail -2
    P=/tmp/pov-probe
    mkdir -p "$P"
    # shellcheck disable=SC2086
    timeout 480 python3 bench/proof_of_value.py --probe --work "$P" --smol-dir /dev/shm/pov-probe ${POV_ARGS:-} \
      > "$P/pov.log" 2>&1
    echo "probe exit $?"
    tail -n 40 "$P/pov.log"
    rm -rf /dev/shm/pov-probe
    pack "$P"
    ;;
  carry3)  # the probe's carry without the probe (SpecForge already ran on this box: docs/performance.md, run 1)
    cp .pov/a/gguf.aa "$C/"
    install_trainers
    python3 -c "import specforge, speculators, datasets; print('trainers import')" 2>&1 | tail -1
    nvidia-smi -L; df -h /tmp /dev/shm | tail -2; free -g | head -2; nproc
    ;;
  carry1) cp .sgl1/*.whl "$C/" && ls "$C" | wc -l ;;
  carry2)
    cp .sgl2/*.whl "$C/" && ls "$C" | wc -l
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$S" "$C"/*.whl \
      > "$W/pip.log" 2>&1 || { echo "pip install failed"; tail -20 "$W/pip.log"; exit 4; }
    sitecustomize
    python3 -c "import sglang, sgl_kernel, dill, openai; print('sglang', sglang.__version__)" 2>&1 | tail -1
    ;;
  start)
    ls "$C"/gguf.aa >/dev/null || { echo "the probe's carry was lost: the box was not kept warm"; exit 3; }
    [ -d "$E/specforge" ] || install_trainers 2>/dev/null || true
    mkdir -p /tmp/assets
    cat "$C"/gguf.aa .pov/d/gguf.ab > /tmp/assets/SmolLM2-135M-Instruct.Q4_1.gguf
    cp .pov/d/*.jsonl .pov/d/*.xz /tmp/assets/
    sha256sum /tmp/assets/*.gguf /tmp/assets/*.xz
    [ -d "$S/sglang" ] || { echo "SGLang is not installed: carry2 was lost (the box was not kept warm)"; exit 3; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$S" .pov/d/whl/*.whl \
      > "$W/pip.log" 2>&1 || { echo "pip install failed"; tail -20 "$W/pip.log"; exit 4; }
    python3 -c "import sglang, sgl_kernel, speculators, specforge, datasets, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)" 2>&1 | tail -2
    (nohup python3 -m compileall -q -j 0 "$S/sglang" > "$W/compileall.log" 2>&1 &)
    rm -f "$W/done"
    # shellcheck disable=SC2086
    setsid bash -c "python3 bench/${POV_SCRIPT:-proof_of_value.py} --work $W ${POV_ARGS:-} > $W/pov.log 2>&1; touch $W/done" \
      < /dev/null > /dev/null 2>&1 &
    sleep 5
    poll
    ;;
  poll) poll ;;
  *) echo "usage: $0 probe|carry1|carry2|carry3|start|poll"; exit 2 ;;
esac

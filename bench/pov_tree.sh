#!/usr/bin/env bash
# The device tool takes at most 64 MiB a call, the working tree included (tracked and untracked-not-ignored files)
# plus the call's carry. The proof-of-value carries (.sgl1, .sgl2, .pov/a, .pov/d) are 54-60 MB each, so the tree
# may hold at most ~7 MB beside .sgl1; the raw trainer metrics in bench/results (*_metrics.jsonl.gz, ~1 MB a run)
# push it over (run 5's first call was refused at 8.1 MB). Run on the controller, in the checkout root:
#   bash bench/pov_tree.sh size      the tree's bytes, and each carry's call total against the limit (exit 1: over)
#   bash bench/pov_tree.sh hold      moves the metrics files to $POV_HOLD (default /tmp/e3o-pov-held) for the calls
#   bash bench/pov_tree.sh restore   moves them back, and checks that git sees them unchanged (exit 1 otherwise)
# Hold before call 1 and restore after the last poll, before any commit: a commit between the two would record
# the metrics files as deleted.
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=$((64 * 1024 * 1024))
HOLD=${POV_HOLD:-/tmp/e3o-pov-held}
tree_bytes() {
  { git ls-files -z; git ls-files -z -o --exclude-standard; } | while IFS= read -r -d '' f; do
    [ -f "$f" ] && stat -c %s "$f"; done | awk '{s += $1} END {print s + 0}'
}
case "${1:-size}" in
  size)
    t=$(tree_bytes) rc=0
    echo "tree: $t bytes"
    for c in .sgl1 .sgl2 .pov/a .pov/d; do
      [ -e "$c" ] || { echo "$c: absent"; continue; }
      b=$(du -sb "$c" | cut -f1)
      if [ $((t + b)) -le "$LIMIT" ]; then v=fits; else v="OVER by $((t + b - LIMIT)) bytes"; rc=1; fi
      echo "$c: $b + tree = $((t + b)) of $LIMIT: $v"
    done
    exit "$rc"
    ;;
  hold)
    mkdir -p "$HOLD"
    n=0
    for f in bench/results/*_metrics.jsonl.gz; do
      [ -e "$f" ] || continue
      mv "$f" "$HOLD/" && n=$((n + 1))
    done
    echo "held $n metrics files in $HOLD; restore them after the last poll: bash bench/pov_tree.sh restore"
    ;;
  restore)
    n=0
    for f in "$HOLD"/*_metrics.jsonl.gz; do
      [ -e "$f" ] || continue
      mv -n "$f" bench/results/ && n=$((n + 1))
    done
    echo "restored $n metrics files"
    if git status --porcelain -- 'bench/results/*_metrics.jsonl.gz' | grep -q '^ D\|^ M'; then
      git status --short -- 'bench/results/*_metrics.jsonl.gz'
      echo "some metrics files are still missing or changed" >&2
      exit 1
    fi
    ;;
  *) echo "usage: bash bench/pov_tree.sh size|hold|restore" >&2; exit 2 ;;
esac

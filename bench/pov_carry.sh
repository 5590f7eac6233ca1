#!/usr/bin/env bash
# Builds what bench/pov.sh carries to the GPU box (issue #31), from what bench/sglang_live_carry.sh and
# ../shared/gpu-box/sglang-wheelhouse.sh downloaded (.devcarry, .sgl2), ../shared/data's regenerated conversations and
# the registry's SpecForge wheel, in two chunks under the device tool's 64 MiB per call (the working tree travels too):
#   .pov/a  GGUF part 1 + the trainers' wheels (speculators, datasets, SpecForge 0.2.0, pydantic)
#   .pov/d  GGUF part 2 + the 15,600 regenerated conversations + MT-bench + 64 held-out ShareGPT first turns
#           + sgl-deep-gemm (SGLang 0.5.17's EAGLE worker imports it with CUDA graphs on)
# Run from the checkout root after those two scripts.
set -euo pipefail
cd "${1:-.}"
DATA=${POV_DATA:-../shared/data/smollm2-regenerated-sharegpt-15600.jsonl.xz}
rm -rf .pov && mkdir -p .pov/a/whl .pov/d/whl
cp .devcarry/a/gguf.aa .pov/a/ && cp .devcarry/b/gguf.ab .pov/d/
for w in speculators datasets hs_connectors multiprocess pydantic_settings python_dotenv; do cp .devcarry/a/whl/${w}-*.whl .pov/a/whl/; done
for w in pydantic pydantic_core annotated_types typing_inspection; do cp .sgl2/${w}-[0-9]*.whl .pov/a/whl/; done
python3 -m pip download -q --no-deps --only-binary=:all: -d .pov/a/whl specforge==0.2.0
cp .devcarry/a/whl/sgl_deep_gemm-*.whl .pov/d/whl/
cp "$DATA" .pov/d/
cp .devcarry/b/mtbench_question.jsonl .pov/d/
# held-out prompts: ShareGPT conversations after the 15,600 (the carry's file is in the same order), none of whose
# user turns occurs among the 15,600's or MT-bench's
python3 - .devcarry/b/sharegpt.jsonl.xz "$DATA" .pov/d/mtbench_question.jsonl .pov/d/heldout.jsonl <<'PY'
import json, lzma, sys
norm = lambda s: " ".join(s.lower().split())
pool = [json.loads(x) for x in lzma.open(sys.argv[1], "rt", encoding="utf-8") if x.strip()]
train = [json.loads(x) for x in lzma.open(sys.argv[2], "rt", encoding="utf-8") if x.strip()]
seen = {norm(t["value"]) for r in train for t in r["conversations"] if t["from"] == "human"}
seen |= {norm(json.loads(x)["turns"][0]) for x in open(sys.argv[3]) if x.strip()}
assert [r["id"] for r in pool[:50]] == [r["id"] for r in train[:50]], "the pool is not the regenerated file's source"
out = [r for r in pool[len(train):] if not any(t["from"] == "human" and norm(t["value"]) in seen for t in r["conversations"])][:64]
with open(sys.argv[4], "w") as f:
    for r in out:
        f.write(json.dumps({"id": r["id"], "conversations": r["conversations"][:1]}) + "\n")
print(f"held-out: {len(out)} of {len(pool) - len(train)} later conversations")
PY
du -sh .pov/a .pov/d

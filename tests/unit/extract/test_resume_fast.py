"""The fast paths behind resume planning (issue #9 target 2) give exactly what the slow ones gave: seq_len straight
from the Arrow files vs ``datasets.load_from_disk``, model facts from config.json vs ``transformers.AutoConfig``,
the one-parse manifest reader vs the line-by-line one (torn tails, duplicates, several rank files)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from eagle3ops.extract import session as extract_session
from eagle3ops.store import HiddenStateStore, ManifestEntry, parse_manifest_file
from tinymodels import build_prepared_dataset


def test_seq_lens_from_arrow_equal_datasets(tmp_path):
    import datasets

    lengths = [3, 70, 5, 1, 2048, 17] * 50
    d = build_prepared_dataset(tmp_path / "d", lengths)
    fast = extract_session._seq_lens_from_arrow(d)
    assert fast == lengths
    assert fast == [int(x) for x in datasets.load_from_disk(str(d))["seq_len"]]
    # several shards, in state.json order
    ds = datasets.load_from_disk(str(d))
    ds.save_to_disk(str(tmp_path / "sharded"), num_shards=3)
    assert len(json.loads((tmp_path / "sharded" / "state.json").read_text())["_data_files"]) == 3
    assert extract_session._seq_lens_from_arrow(tmp_path / "sharded") == lengths
    # a layout it does not know falls back (None), and load_seq_lens still answers through datasets
    (tmp_path / "sharded" / "state.json").write_text("{}")
    assert extract_session._seq_lens_from_arrow(tmp_path / "sharded") is None


def test_plan_imports_neither_datasets_nor_transformers(tmp_path, tiny_target):
    """``extract --plan`` on a plain dataset and config: neither heavy package is imported (they cost 3-12 s of
    the 13-16 s a fresh --check process took under load)."""
    d = build_prepared_dataset(tmp_path / "d", [4, 9, 16])
    code = (
        "import sys, json; from eagle3ops.extract.session import ExtractConfig, plan_extraction; "
        f"r = plan_extraction(ExtractConfig(data_dir={str(d)!r}, model_path={str(tiny_target)!r})); "
        "print(json.dumps([r['to_extract'], 'datasets' in sys.modules, 'transformers' in sys.modules, "
        "'torch' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [3, False, False, False]


@pytest.mark.parametrize(
    "cfg",
    [
        {"model_type": "llama", "hidden_size": 48, "num_hidden_layers": 6, "num_attention_heads": 4},
        {
            "model_type": "llava",
            "text_config": {"model_type": "llama", "hidden_size": 96, "num_hidden_layers": 5},
            "vision_config": {
                "model_type": "clip_vision_model",
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
            },
        },
    ],
)
def test_model_facts_from_json_equal_autoconfig(tmp_path, cfg):
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps(cfg))
    facts = extract_session.model_facts(tmp_path)
    ac = AutoConfig.from_pretrained(str(tmp_path))
    text = ac.get_text_config()
    assert (facts["num_layers"], facts["hidden_size"], facts["model_type"]) == (
        text.num_hidden_layers,
        text.hidden_size,
        ac.model_type,
    )


def test_model_facts_real_target_and_fallback(tmp_path, tiny_target):
    from transformers import AutoConfig

    facts = extract_session.model_facts(tiny_target)
    ac = AutoConfig.from_pretrained(str(tiny_target))
    assert (facts["num_layers"], facts["hidden_size"]) == (ac.num_hidden_layers, ac.hidden_size)
    # GPT-2 names them n_layer/n_embd: the JSON path declines and AutoConfig's attribute map answers
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "n_layer": 7, "n_embd": 40, "n_head": 4})
    )
    assert extract_session._facts_from_config_json(tmp_path / "config.json") is None
    assert (
        extract_session.model_facts(tmp_path)["num_layers"],
        extract_session.model_facts(tmp_path)["hidden_size"],
    ) == (
        7,
        40,
    )


def _slow_parse(path):
    """The line-by-line reader alone (the fast path disabled by a blank line in the middle)."""
    from eagle3ops.store import ManifestScan

    scan = ManifestScan()
    data = path.read_bytes()
    tmp = path.with_name("slow.jsonl")
    tmp.write_bytes(data.replace(b"\n", b"\n\n", 1) if data.count(b"\n") > 1 else data)
    parse_manifest_file(tmp, scan)
    return scan


@pytest.mark.parametrize("tail", ["", '{"i":99,"n":', "\n"])
def test_manifest_fast_path_equals_line_by_line(tmp_path, tail):
    store = HiddenStateStore(tmp_path)
    store.append_manifest([ManifestEntry(i, 10 + i, 100 * i, (i * 7) if i % 2 else None) for i in range(50)])
    store.append_manifest([ManifestEntry(3, 999, 1)])  # a re-written sample: the later line wins
    store.close()
    with open(store.manifest_path(), "a") as f:
        f.write(tail)
    fast = store.scan_manifest()
    slow = _slow_parse(store.manifest_path())
    assert fast.entries == slow.entries and fast.indices() == set(range(50))
    assert fast.entries[3] == ManifestEntry(3, 999, 1)
    assert bool(fast.torn_lines) == (tail == '{"i":99,"n":')


def test_manifest_files_merge_in_order(tmp_path):
    """A fast-path file (rank 0) and a slow-path file (rank 1, torn tail) merge like before."""
    a, b = HiddenStateStore(tmp_path, rank=0), HiddenStateStore(tmp_path, rank=1)
    a.append_manifest([ManifestEntry(i, 5, 5) for i in range(0, 10, 2)])
    b.append_manifest([ManifestEntry(i, 6, 6, rank=1) for i in range(1, 10, 2)])
    a.close()
    b.close()
    with open(b.manifest_path(), "a") as f:
        f.write('{"i":11')
    scan = a.scan_manifest()
    assert scan.indices() == set(range(10)) and len(scan.torn_lines) == 1
    assert scan.entries[1].rank == 1 and scan.entries[2].seq_len == 5

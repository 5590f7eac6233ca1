"""The regenerate phase's transformers backend on the real tiny demo target (built once per session at the path
test_demo.py/test_prepare.py use): every generated token is a greedy choice, and a second run changes nothing.
The openai backend's runs: tests/unit/regenerate/test_regenerate.py.
"""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from eagle3ops.regenerate.config import RegenerateConfig
from eagle3ops.regenerate.run import iter_output, regenerate
from regenerate_inputs import _norm, _write


# ---------------------------------------------------------------------------------------------------
# the transformers backend on the real tiny demo target
# ---------------------------------------------------------------------------------------------------
def test_transformers_backend_on_the_demo_target(demo, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    convs = [json.loads(line) for line in Path(demo["conversations_path"]).read_text().splitlines()[:2]]
    src = _write(tmp_path / "demo.jsonl", convs)
    out = tmp_path / "regen.jsonl"
    cfg = RegenerateConfig(
        model=demo["model_path"],
        inputs=[str(src)],
        out=str(out),
        max_new_tokens=12,
        concurrency=2,
        threads=1,  # 2 threads on a loaded 2-core box are 10x slower for this tiny model
        log=lambda m: None,
    )
    r = regenerate(cfg)
    assert r["changed"] and r["num_written"] == 2 and r["output_tokens"] > 0 and r["tok_per_s"] > 0
    got = list(iter_output(out))
    # every generated token is a greedy choice of an independent forward (one conversation at a time, no padding),
    # up to ties: the batched, padded forward of the run rounds differently, and the random demo model has near-ties
    # that the two break differently on some CPUs (CI of 2026-12-04: '9 + 12' vs '2 + 12', logits 1e-6 apart).
    # Checked along the run's own tokens (teacher-forced), so one tie cannot hide what follows it.
    tie = 1e-3
    tok = AutoTokenizer.from_pretrained(demo["model_path"])
    model = AutoModelForCausalLM.from_pretrained(demo["model_path"]).eval()
    eos = tok.eos_token_id
    n_turns = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the run above (threads=1); restored below
    for before, after in zip(convs, got, strict=True):
        key = "conversations" if "conversations" in before else "messages"
        assert len(before[key]) == len(after[key])
        history = []
        for t_old, t_new in zip(before[key], after[key], strict=True):
            role = _norm(t_old)
            if role == "assistant":
                ids = tok.encode(
                    tok.apply_chat_template(history, add_generation_prompt=True, tokenize=False),
                    add_special_tokens=False,
                )
                text = t_new.get("value", t_new.get("content"))
                new = tok.encode(text, add_special_tokens=False)
                assert tok.decode(new, skip_special_tokens=False) == text
                assert len(new) <= 12
                with torch.no_grad():
                    logits = model(torch.tensor([ids + new])).logits[0, len(ids) - 1 :]
                for k, chosen in enumerate(new):
                    top = float(logits[k].max())
                    assert float(logits[k, chosen]) >= top - tie, (
                        f"token {k} of turn {n_turns}: {chosen} is {top - float(logits[k, chosen]):.2e} below "
                        "the greedy choice"
                    )
                if len(new) < 12:  # it stopped: end of sequence was the greedy choice there
                    assert float(logits[len(new), eos]) >= float(logits[len(new)].max()) - tie
                n_turns += 1
            else:
                assert t_new == t_old
                text = t_new.get("value", t_new.get("content"))
            history.append({"role": role, "content": text})
    torch.set_num_threads(threads)
    assert r["turns_generated"] == n_turns
    again = regenerate(cfg)  # second run: unchanged, no model loaded
    assert not again["changed"] and again["fingerprint"] == r["fingerprint"] and again["num_written"] == 2
    # prepare reading the output unchanged: tests/ansible/test_regenerate_role.py (site.yml regenerate,prepare)

"""Offline acceptance measurement, the report, and the SGLang-side command lines (rendering only).

Real: the target is a transformers DeepseekV3ForCausalLM (tiny, random init: ``train_fixtures``), the draft a
speculators 0.9.0 checkpoint made by speculators' own code (``eagle3_draft_fixture``: random decoder weights)
and run through speculators' modules; the chain is compared with speculators' own training forward.
Constructed drafts (the proof the issue asks for): an oracle that proposes the target's own greedy choice
must reach the maximum acceptance length k+1; uniformly random tokens must stay near 1.
The SGLang server cannot run here (CUDA): its unit file and bench command are rendered and their flags checked
against the real 0.5.23 source (ServerArgs fields; the bench's argparse).
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import contextlib

from eagle3_draft_fixture import make_draft_checkpoint
from eagle3ops.benchmark import acceptance as acc
from eagle3ops.benchmark import report as rp
from eagle3ops.train.fixtures import make_tiny_verifier
from report_inputs import acceptance_result
from serve_flags import BOX_BACKEND_FLAGS

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # far faster than 2 contended threads on the shared CI machine
    root = tmp_path_factory.mktemp("acceptance")
    verifier = make_tiny_verifier(root / "verifier", vocab_size=512)
    ckpt = make_draft_checkpoint(root / "ckpt", verifier)
    drafter = acc.Eagle3Drafter(ckpt)
    target = acc.Target(verifier, drafter.layer_ids)
    g = torch.Generator().manual_seed(3)
    prompts = [
        {"id": f"p{i}", "input_ids": torch.randint(3, 500, (12,), generator=g).tolist()} for i in range(3)
    ]
    (root / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    yield {
        "root": root,
        "verifier": verifier,
        "ckpt": ckpt,
        "drafter": drafter,
        "target": target,
        "prompts": prompts,
    }
    # a process-wide setting: later tests in this process compare bytes with subprocesses using the default
    torch.set_num_threads(threads)


def test_draft_chain_equals_speculators_own_forward(setup):
    """Step 0 at every position and the k-step chain at the last one match Eagle3DraftModel.forward (which
    feeds shifted ground-truth tokens, 0 past the end: the chain is fed the same here)."""
    import torch

    d, t = setup["drafter"], setup["target"]
    ids = list(range(5, 45))
    _, aux = t.forward(ids)
    captured = []
    hook = d.model.lm_head.register_forward_hook(lambda _m, _a, out: captured.append(out[0, -1].clone()))
    try:
        with torch.no_grad():
            theirs = d.model(
                hidden_states=aux[:-1][None],
                input_ids=torch.tensor([ids[1:]]),
                document_ids=torch.zeros(1, len(ids) - 1, dtype=torch.long),
                ttt_steps=3,
            )
    finally:
        hook.remove()
    assert torch.equal(d.prefix_predictions(aux, ids), d.to_target(theirs[0][0]))
    tokens, logits = d.chain(ids, aux[:-1], 3, feed=[0, 0])
    assert tokens == [int(d.to_target(theirs[s][0, -1])) for s in range(3)]
    for s in range(3):  # the same numbers, not only the same argmax (positions, cache, hidden feedback)
        assert torch.allclose(logits[s], captured[len(captured) - 3 + s], atol=1e-5), s
    assert d.propose(ids, aux[:-1], 3)[0] == tokens[0]  # its own chain starts from the same first draft


def test_incremental_path_equals_the_whole_sequence_recomputed(setup):
    """The measurement's default keeps KV caches as a server does (the target verifies only the new tokens, the
    draft computes only the pairs committed since its last proposal); it must give what recomputing everything
    gives. The draft is checked on a sequence that grows by 1 to 4 tokens between proposals (several new queries
    after cached keys: the case sdpa's own causal flag would get wrong), the target through whole measurements."""
    import torch
    from transformers import DynamicCache

    d, t = setup["drafter"], setup["target"]
    ids = list(range(5, 60))
    _, aux = t.forward(ids)
    d.begin()
    try:
        n = 12
        for grow in (1, 3, 4, 2, 1, 4, 3):
            n += grow
            got = d.propose(ids[: n + 1], aux[:n], 3)
            assert got == d.chain(ids[: n + 1], aux[:n], 3)[0], n
    finally:
        d.end()
    # the target's incremental forward: the same choices and states as the whole sequence's
    cache = DynamicCache()
    c0, a0 = t.extend(cache, ids[:20], 0)
    t.extend(cache, [7, 8, 9], 20)  # rejected drafts, dropped by the next call
    c1, a1 = t.extend(cache, ids[20:24], 20)
    full_c, full_a = t.forward(ids[:24])
    assert c0 + c1 == full_c and torch.allclose(torch.cat([a0, a1]), full_a, atol=1e-5)
    for drafter in (d, acc.RandomDrafter(512, seed=2)):
        kw = {"k": 3, "max_new_tokens": 10}
        inc = acc.measure(
            t, drafter if drafter is d else acc.RandomDrafter(512, seed=2), setup["prompts"], **kw
        )
        ref = acc.measure(t, drafter, setup["prompts"], incremental=False, **kw)
        assert (
            inc["accepted_histogram"] == ref["accepted_histogram"] and inc["per_prompt"] == ref["per_prompt"]
        )


def test_oracle_draft_reaches_k_plus_1_and_random_stays_near_1(setup):
    t, prompts = setup["target"], setup["prompts"]
    k = 3
    oracle = acc.measure(t, acc.OracleDrafter(t), prompts, k=k, max_new_tokens=12)
    assert oracle["acceptance_length"] == k + 1 == oracle["max_acceptance_length"]
    assert oracle["per_position"] == [1.0] * k and oracle["accepted_histogram"][:k] == [0] * k
    rnd = acc.measure(t, acc.RandomDrafter(512, seed=1), prompts, k=k, max_new_tokens=12)
    assert 1.0 <= rnd["acceptance_length"] < 1.1
    assert rnd["verify_steps"] >= 3 * rnd["prompts"]

    # a draft right at exactly one position: acceptance exactly 2 per step
    class FirstOnly(acc.OracleDrafter):
        def propose(self, ids, aux, k):
            good = super().propose(ids, aux, 1)
            return good + [(good[0] + 1) % 512] * (k - 1) if k > 1 else good

    one = acc.measure(t, FirstOnly(t), prompts, k=k, max_new_tokens=12)
    # (the wrong 2nd token can still equal the target's choice by chance; never below 2)
    assert 2.0 <= one["acceptance_length"] < 2.5 and one["per_position"][0] == 1.0


def test_cli_measures_once_and_then_is_up_to_date(setup, capsys):
    from eagle3ops.cli import main

    out = setup["root"] / "acceptance.json"
    argv = [
        "benchmark-acceptance",
        "--checkpoint",
        str(setup["ckpt"]),
        "--target",
        str(setup["verifier"]),
        "--prompts",
        str(setup["root"] / "prompts.jsonl"),
        "--out",
        str(out),
        "--k",
        "2",
        "--max-new-tokens",
        "6",
        "--json",
    ]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["changed"] is True and out.is_file()
    r = res["result"]
    assert r["draft"]["k"] == 2 and len(r["draft"]["per_position"]) == 2 and r["layer_ids"] == [2, 4, 5]
    assert 1.0 <= r["random_draft"]["acceptance_length"] <= 3.0
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["changed"] is False
    assert main([*argv[:-1], "--k", "3", "--json", "--check"]) == 0  # other settings: would measure again
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["changed"] is True
    # in the server's dtype: another measurement, recorded as such; a GPU asked for on a host without one: refused
    bf16 = setup["root"] / "acceptance-bf16.json"
    assert main([*argv[:-1], "--dtype", "bfloat16", "--out", str(bf16), "--json"]) == 0
    r16 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["result"]
    assert r16["dtype"] == "bfloat16" and r16["inputs"]["settings"]["dtype"] == "bfloat16"
    assert r16["draft"]["verify_steps"] > 0 and 1.0 <= r16["draft"]["acceptance_length"] <= 3.0
    assert (
        "dtype" not in r["inputs"]["settings"]
    )  # the default is not recorded: earlier results stay up to date
    gpu = setup["root"] / "acceptance-gpu.json"
    assert main([*argv[:-1], "--device", "cuda", "--out", str(gpu), "--json"]) == 2
    assert "sees no GPU on this host; use device cpu" in capsys.readouterr().err and not gpu.exists()
    # the report from it: written once, then left alone
    rep_dir = setup["root"] / "report"
    argv = ["benchmark-report", "--out-dir", str(rep_dir), "--acceptance", str(out), "--json"]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["changed"] and (rep_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (rep_dir / "report.md").read_text()
    assert "| trained |" in md and "| random tokens |" in md and "pos 2" in md
    assert "not run (no SGLang server" in md
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["changed"] is False


def _wheel_member(name: str) -> str:
    from sglang_standin import _find_wheel, pristine_deepseek_v2

    if _find_wheel() is None:
        pristine_deepseek_v2()
    with zipfile.ZipFile(_find_wheel()) as z:
        return z.read(name).decode()


def test_report_with_sglang_results(tmp_path):
    """SGLang's bench JSONL (keys of 0.5.23's result record) side by side; speed-up; plot with both panels."""
    src = _wheel_member("sglang/benchmark/serving.py")
    for key in rp.SGLANG_KEYS:
        assert f'"{key}":' in src, f"{key} is not in sglang 0.5.23's bench result record"
    acceptance = acceptance_result(2.5, [0.8, 0.5, 0.2], [0.8, 0.625, 0.4])
    w, wo = tmp_path / "with.jsonl", tmp_path / "without.jsonl"
    w.write_text(
        json.dumps({"output_throughput": 1.0})
        + "\n"
        + json.dumps(
            {
                "output_throughput": 300.0,
                "median_e2e_latency_ms": 900.0,
                "accept_length": 2.9,
                "completed": 32,
            }
        )
        + "\n"
    )
    wo.write_text(
        json.dumps({"output_throughput": 120.0, "median_e2e_latency_ms": 2000.0, "completed": 32}) + "\n"
    )
    with_rec = rp.read_sglang_bench(w)
    with_rec["spec_probe"] = {"completion_tokens": 30, "spec_verify_ct": 12, "acceptance_length": 2.5}
    res = rp.write(tmp_path / "r", acceptance, with_rec, rp.read_sglang_bench(wo))
    assert "completion tokens / spec_verify_ct (greedy /generate probe): 2.500" in res["markdown"]
    assert res["report"]["sglang"]["acceptance_length_spec_verify"] == 2.5
    res = rp.write(tmp_path / "r", acceptance, rp.read_sglang_bench(w), rp.read_sglang_bench(wo))
    s = res["report"]["sglang"]
    assert s["speedup"] == 2.5 and s["with_draft"]["accept_length"] == 2.9  # the last record of the file
    assert "| with draft (EAGLE3) | 300.00 | 900.00 |" in res["markdown"]
    assert "| without draft | 120.00 | 2000.00 |" in res["markdown"]
    assert (
        rp.write(tmp_path / "r", acceptance, rp.read_sglang_bench(w), rp.read_sglang_bench(wo))["changed"]
        is False
    )
    acceptance["draft"]["acceptance_length"] = 2.6
    assert rp.write(tmp_path / "r", acceptance, None, None, check=True)["changed"] is True
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(rp.ReportError, match="empty SGLang benchmark output"):
        rp.read_sglang_bench(tmp_path / "empty.jsonl")


def _render(template: Path, **variables) -> str:
    """Render a role template as Ansible's template module does (Jinja2, trim_blocks). STAND-IN: jinja2 directly
    instead of a playbook run (the server units are only installed on hosts with SGLang and systemd)."""
    import shlex

    import jinja2

    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["quote"] = shlex.quote
    return env.from_string(template.read_text()).render(ansible_managed="Ansible managed", **variables)


def _serve_vars(**over):
    """The serve role's defaults over the shared ones (roles/eagle3ops, its dependency) + vars/main.yml (the argv
    lists), resolved as Ansible would. STAND-IN: native Jinja2 with the few Ansible filters these expressions use,
    instead of a playbook run."""
    import hashlib
    import shlex

    import jinja2
    import jinja2.nativetypes
    import yaml

    d = yaml.safe_load((REPO / "roles/eagle3ops/defaults/main.yml").read_text())
    d.update(yaml.safe_load((REPO / "roles/serve/defaults/main.yml").read_text()))
    d.update(yaml.safe_load((REPO / "roles/serve/vars/main.yml").read_text()))
    d.update(
        serve_sglang_version="0.5.23",
        serve_sglang_venv_dir="/opt/sgl",
        serve_model_path="/data/models/K",
        serve_tp_size=8,
        serve_draft_dir="/data/eagle3/serve/draft",
        serve_convert={},
    )
    d.update(over)
    env = jinja2.nativetypes.NativeEnvironment(undefined=jinja2.StrictUndefined)
    env.filters.update(
        bool=lambda v: v if isinstance(v, bool) else str(v).lower() in ("true", "yes", "1"),
        combine=lambda a, b: {**a, **b},
        quote=shlex.quote,
        to_json=json.dumps,
        hash=lambda v, algo: hashlib.new(algo, str(v).encode()).hexdigest(),
        regex_replace=lambda v, pattern, repl: re.sub(pattern, repl, str(v)),
    )

    def resolve(v, depth=0):
        if isinstance(v, str) and "{{" in v and depth < 10:
            return resolve(env.from_string(v).render(**{k: d[k] for k in d if k not in seen}), depth + 1)
        if isinstance(v, list):
            return [resolve(x, depth) for x in v]
        return v

    seen: set = set()
    for _ in range(5):  # defaults refer to each other: resolve until stable
        for k in list(d):
            with contextlib.suppress(jinja2.UndefinedError):
                d[k] = resolve(d[k])
    return d


def test_serve_unit_renders_valid_sglang_flags(tmp_path):
    import shutil
    import subprocess

    tpl = REPO / "roles/serve/templates/eagle3ops-sglang-serve.service.j2"
    box = {  # the flags the lent H200 box needs (docs/serve-benchmark.md)
        "serve_attention_backend": "triton",
        "serve_draft_attention_backend": "triton",
        "serve_sampling_backend": "pytorch",
        "serve_grammar_backend": "none",
        "serve_disable_cuda_graph": True,
        "serve_environment": {"PYTHONPATH": "/tmp/sglsite"},
    }
    v = _serve_vars(serve_draft_window_size=2048, serve_mem_fraction_static=0.85, **box)
    unit = _render(tpl, **v, serve_unit_speculative=True, serve_unit_argv=v["serve_draft_argv"])
    exec_start = unit.split("ExecStart=", 1)[1].split("\n\n")[0].replace("\\\n", " ")
    args = exec_start.split()
    assert args == v["serve_draft_argv"]  # the same argv the process launcher runs
    assert "Environment=PYTHONPATH=/tmp/sglsite" in unit and "Environment=PYTHONUNBUFFERED=1" in unit
    assert args[:3] == ["/opt/sgl/bin/python", "-m", "sglang.launch_server"]
    joined = " ".join(args)
    for flag in (
        "--speculative-algorithm EAGLE3",
        "--speculative-draft-model-path /data/eagle3/serve/draft",
        "--speculative-num-steps 3",
        "--speculative-eagle-topk 1",
        "--speculative-num-draft-tokens 4",
        "--speculative-draft-window-size 2048",
        "--tp-size 8",
        "--port 30000",
        "--mem-fraction-static 0.85",
        *BOX_BACKEND_FLAGS,
    ):
        assert flag in joined, flag
    # the box's flags (SGLang 0.5.17 there) are CLI options of 0.5.17; the default flags are options of 0.5.23
    assert {a for a in args if a.startswith("--")} <= _cli_flags("0.5.17"), "not 0.5.17 options"
    v23 = _serve_vars(
        serve_draft_window_size=2048,
        serve_mem_fraction_static=0.85,
        serve_attention_backend="triton",
        serve_draft_attention_backend="triton",
        serve_disable_cuda_graph=True,
    )
    flags23 = {a for a in v23["serve_draft_argv"] if a.startswith("--")}
    missing = flags23 - _cli_flags("0.5.23")
    assert not missing, f"{missing}: not CLI fields of sglang 0.5.23's ServerArgs"
    v = _serve_vars()
    base = _render(tpl, **v, serve_unit_speculative=False, serve_unit_argv=v["serve_baseline_argv"])
    assert "--speculative" not in base and "--port 30002" in base and "--model-path /data/models/K" in base
    assert "--dtype bfloat16" in base
    if shutil.which("systemd-analyze"):
        p = tmp_path / "eagle3ops-sglang-serve.service"
        p.write_text(unit.replace("/opt/sgl/bin/python", shutil.which("true")))
        v = subprocess.run(["systemd-analyze", "verify", str(p)], capture_output=True, text=True)
        assert v.returncode == 0, v.stderr


def test_serve_command_lines_carry_trust_remote_code_exactly_when_set():
    """serve_trust_remote_code (the shared eagle3ops_trust_remote_code, false by default) puts
    --trust-remote-code on both served command lines (the draft server's and the baseline's): SGLang then loads
    the target's own tokenizer code, the ids the draft was trained on."""
    off = _serve_vars()
    assert off["serve_trust_remote_code"] is False
    assert "--trust-remote-code" not in off["serve_draft_argv"] + off["serve_baseline_argv"]
    for value in (True, "true"):  # a bool, or a string from an inventory / extra vars
        on = _serve_vars(eagle3ops_trust_remote_code=value)
        for argv in ("serve_draft_argv", "serve_baseline_argv"):
            assert on[argv].count("--trust-remote-code") == 1, (value, argv)
            assert [a for a in on[argv] if a != "--trust-remote-code"] == off[argv], (value, argv)


def _cli_flags(version: str) -> set[str]:
    """Every command-line flag of that SGLang version's launch_server: ServerArgs fields without no_cli (in
    arg_groups/fields/*.py from 0.5.23 on, in srt/server_args.py before) and the extra parser.add_argument ones."""
    from sglang_standin import sglang_wheel

    with zipfile.ZipFile(sglang_wheel(version)) as z:
        names = [
            n for n in z.namelist() if n.startswith("sglang/srt/arg_groups/fields/") and n.endswith(".py")
        ]
        names += ["sglang/srt/server_args.py"] if "sglang/srt/server_args.py" in z.namelist() else []
        src = "\n".join(z.read(n).decode() for n in names)
    flags = set()
    starts = list(re.finditer(r"^    ([a-z][a-z0-9_]*): A\[", src, re.M))
    for m, nxt in zip(starts, [*starts[1:], None], strict=False):
        body = src[m.end() : nxt.start() if nxt else len(src)]
        body = body[: body.find("] = ") + 1] if "] = " in body else body  # this field only
        if "no_cli=True" not in body:
            flags.add("--" + m.group(1).replace("_", "-"))
    flags |= set(re.findall(r'add_argument\(\s*"(--[a-z][a-z0-9-]*)"', src))
    return flags


def _wheel_names():
    from sglang_standin import _find_wheel

    with zipfile.ZipFile(_find_wheel()) as z:
        return z.namelist()


def test_bench_dataset_from_heldout_prompts(tmp_path, capsys):
    from eagle3ops.cli import main

    src = tmp_path / "heldout.jsonl"
    src.write_text(
        json.dumps(
            {
                "id": "h0",
                "prompt": "Compute 1 + 2.",
                "reference": "3.",
                "conversations": [{"from": "human", "value": "Compute 1 + 2."}],
            }
        )
        + "\n"
    )
    out = tmp_path / "bench.jsonl"
    assert main(["benchmark-dataset", "--prompts", str(src), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["changed"] is True
    row = json.loads(out.read_text())
    assert row["conversations"] == [
        {"role": "user", "content": "Compute 1 + 2."},
        {"role": "assistant", "content": "3."},
    ]
    assert main(["benchmark-dataset", "--prompts", str(src), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["changed"] is False


def test_spec_probe_counts_completion_tokens_over_verify_steps(tmp_path, capsys):
    """STAND-IN server: a local HTTP /generate answering with the meta_info keys SGLang 0.5.23 sets
    (``completion_tokens``, ``spec_verify_ct``: asserted in its tokenizer_manager.py)."""
    import http.server
    import threading

    from eagle3ops.cli import main

    src = _wheel_member("sglang/srt/managers/tokenizer_manager.py")
    assert 'meta_info["spec_verify_ct"]' in src and '"completion_tokens":' in src
    seen = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            n = len(seen)
            meta = {"completion_tokens": 10 * n, "spec_verify_ct": 4 * n} if body["text"] != "plain" else {}
            data = json.dumps({"text": "x", "meta_info": meta}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        prompts = tmp_path / "p.jsonl"
        prompts.write_text("".join(json.dumps({"id": i, "prompt": f"q{i}"}) + "\n" for i in range(2)))
        argv = [
            "benchmark-spec-probe",
            "--url",
            url,
            "--prompts",
            str(prompts),
            "--out",
            str(tmp_path / "o.json"),
        ]
        assert main([*argv, "--max-new-tokens", "7", "--json"]) == 0
        res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert (res["completion_tokens"], res["spec_verify_ct"], res["acceptance_length"]) == (30, 12, 2.5)
        assert (
            seen[0]["sampling_params"] == {"temperature": 0, "max_new_tokens": 7} and seen[1]["text"] == "q1"
        )
        prompts.write_text(json.dumps({"id": 0, "prompt": "plain"}) + "\n")  # no verify step, no /server_info
        assert main([*argv, "--json"]) == 2
        msg = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["msg"]
        assert "none of the 1 probe answers reached a verify step" in msg and "did not say" in msg
    finally:
        srv.shutdown()


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    import struct

    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_report_without_live_results_says_why_and_judges_the_random_baseline(tmp_path, capsys):
    """Issue 32, the report as the benchmark role writes it on a host without a GPU/SGLang: the offline
    acceptance (the trained draft no better than random, as the SmolLM2 profile at CPU scale: 1.000 vs 1.000)
    and the contamination check, no live results. It drew an empty "Live server" panel and a table of headers
    with no reason given; now it says why there is no live measurement, draws one panel, and says that the
    trained draft is no better than random and whether that is expected at its training scale."""
    from eagle3ops.cli import main

    acceptance = acceptance_result(1.0, [0.0, 0.0, 0.0], [0.0, None, None])
    acceptance["random_draft"] = {"acceptance_length": 1.0, "per_position": [0.0, 0.0, 0.0]}
    acceptance["draft_training"] = {"epoch": 0, "local_step": 10, "global_step": 10}
    (tmp_path / "acc.json").write_text(json.dumps(acceptance))
    cont = {"clean": True, "mode": "fail", "training_user_turns": 40, "contaminated": {}}
    (tmp_path / "cont.json").write_text(json.dumps(cont))
    argv = ["benchmark-report", "--out-dir", str(tmp_path / "r"), "--acceptance", str(tmp_path / "acc.json")]
    argv += ["--contamination", str(tmp_path / "cont.json"), "--json"]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    md = (tmp_path / "r" / "report.md").read_text()
    assert md.strip() == res["markdown"].strip()
    assert "SGLang serving benchmark: not run (no SGLang server on this host: no live results" in md, md
    assert "only where SGLang runs on a GPU" in md and "Nothing is tabled or drawn for it" in md
    assert "| prompt set | concurrency |" not in md  # no table of headers only
    assert "Contamination check: clean (no benchmark prompt among 40 training user turns)" in md
    assert "The trained draft is no better than random tokens (1.000 vs 1.000, 10 verify steps)." in md
    assert "Expected at this scale: the draft trained 10 optimizer steps, a smoke run" in md
    # one panel, the offline one: a single 5.5 x 4 inch figure at 100 dpi (three panels were 16.5 inches wide)
    assert _png_size(tmp_path / "r" / "report.png") == (550, 400)
    # a draft that trained long and is still no better than random: said to be unexpected, with what to check
    acceptance["draft_training"]["global_step"] = 20000
    off = rp.build(acceptance)["offline"]
    assert "Not expected after 20000 optimizer steps" in rp.versus_random(off)
    del acceptance["draft_training"]
    assert "does not say" in rp.versus_random(rp.build(acceptance)["offline"])
    # better than random: nothing to say
    acceptance["draft"]["acceptance_length"] = 1.4
    assert rp.versus_random(rp.build(acceptance)["offline"]) is None

"""The memory preflight (eagle3ops.memory_fit, eagle3ops.checkpoint_files, ``eagle3ops memory-fit``).

Kimi-K2.5's checkpoint (~595 GB) cannot be on this machine: its :class:`ModelMemory` is computed from the published
architecture (61 layers, hidden 7168, MLA 1536/512/64/128, 384 routed experts of 2048 in 60 MoE layers, INT4 group
32 with a bf16 scale a group, a dense first layer of 18,432, vocab 163,840) and a ~0.45 B-parameter vision tower;
the byte counting itself runs on a real (tiny) safetensors checkpoint in the same layout. GPU sizes are what
nvidia-smi prints: 97,887 MiB (RTX PRO 6000 Blackwell), 143,771 MiB (H200).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from eagle3ops import checkpoint_files, cli, memory_fit
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parents[3]
GROUP_VARS = REPO / "inventory" / "production.example" / "group_vars"
RTX_PRO_6000, H200 = 97887, 143771
DRAFT = 4 * 10**9  # a Llama-style EAGLE-3 draft of Kimi-K2.5 with its own embedding, bf16


def kimi_k25() -> memory_fit.ModelMemory:
    h, layers, moe, experts, inter = 7168, 61, 60, 384, 2048
    routed = moe * experts * 3 * h * inter
    int4 = routed // 2 + routed // 32 * 2 + moe * experts * 3 * 8  # packed, scales, weight_shape
    sharded = (
        2 * 163840 * h + layers * (1536 * 64 * 192 + 512 * 64 * 256 + 64 * 128 * h) + moe * 3 * h * inter
    )
    sharded += 3 * h * 18432
    replicated = layers * (h * 1536 + h * 576 + 2 * h + 1536 + 512) + h + moe * experts * h + 450_000_000
    return memory_fit.ModelMemory(
        sharded_bytes=int4 + 2 * sharded,
        replicated_bytes=2 * replicated,
        kv_latent=512 + 64,
        kv_heads=64,
        head_dim=192,
        num_layers=layers,
        hidden_size=h,
        max_positions=262144,
    )


def _profile(phase: str, gpu: int, args: list, **kw) -> memory_fit.Profile:
    f = memory_fit.server_flags(args)
    return memory_fit.Profile(
        phase=phase,
        gpu_memory_mib=gpu,
        tp_size=8,
        context_length=f.get("context_length", 262144),
        mem_fraction_static=f.get("mem_fraction_static"),
        chunked_prefill_size=-1 if phase == "capture" else f.get("chunked_prefill_size", 8192),
        max_prefill_tokens=f.get("max_prefill_tokens", 16384),
        cuda_graph_max_bs=f.get("cuda_graph_max_bs", 512),
        speculative=phase == "serve",
        draft_bytes=DRAFT if phase == "serve" else 0,
        **kw,
    )


def _vars(name: str) -> dict:
    return yaml.safe_load((GROUP_VARS / name).read_text())


def test_kimi_k25_needs_a_reduced_context_on_8_rtx_pro_6000():
    model, bw = kimi_k25(), _vars("rtx_pro_6000.yml")
    assert 590e9 < model.sharded_bytes + model.replicated_bytes < 600e9  # ~595 GB, as published
    assert (
        model.kv_bytes_per_token(8) == 70272
        and round(model.weight_bytes_per_gpu(8) / memory_fit.GIB, 1) == 71.8
    )
    # the shipped profile fits: capture (with one 8,192-token prefill's dump buffers) and serving (with a draft)
    cap = memory_fit.check(model, _profile("capture", RTX_PRO_6000, bw["sglang_extra_args"]))
    assert cap["capture"] == 8192 * 7168 * (4 * 2 + 5 * 2) and cap["max_context_length"] > 32768
    serve_args = [*bw["serve_extra_args"], "--mem-fraction-static", str(bw["serve_mem_fraction_static"])]
    served = memory_fit.check(model, _profile("serve", RTX_PRO_6000, serve_args))
    assert served["kv"] == 131072 * 70272 and served["reserve"] == 12 * memory_fit.GIB
    # the model's own 262,144 tokens do not, whatever the fraction: the refusal names numbers and variables
    full = [a for a in serve_args if a not in ("--context-length", "131072")]
    with pytest.raises(memory_fit.MemoryFitError) as e:
        memory_fit.check(model, _profile("serve", RTX_PRO_6000, full))
    msg = str(e.value)
    assert (
        "no mem_fraction_static fits: weights 72.3 GiB + KV 17.2 GiB + reserve 12.0 GiB = 101.4 GiB > 95.6"
        in msg
    )
    assert "lower the context to 173,248 tokens or less (serve_extra_args: --context-length)" in msg
    assert "serve_tp_size 8" in msg and e.value.details["kv"] == 262144 * 70272
    # SGLang's own defaults for capture (un-chunked 16,384-token prefills, its fraction) fit no context at all
    with pytest.raises(
        memory_fit.MemoryFitError, match=r"no context length fits .* --max-prefill-tokens, 16,384"
    ):
        memory_fit.check(model, _profile("capture", RTX_PRO_6000, ["--trust-remote-code"]))


def test_kimi_k25_on_8_h200_fits_the_full_context_and_counts_the_dump_buffers():
    model, h200 = kimi_k25(), _vars("gpu_hosts.yml")
    served = memory_fit.check(model, _profile("serve", H200, []))
    assert served["mem_fraction_static"] == 0.882 and served["max_context_length"] > 262144
    # SGLang's own fraction leaves exactly its reserve outside: one prefill's dump buffers (2.0 GiB) do not fit
    with pytest.raises(
        memory_fit.MemoryFitError, match=r"leaves 26\.5 GiB .* capture buffers 2\.0 GiB .* to 0\.79"
    ):
        memory_fit.check(model, _profile("capture", H200, ["--trust-remote-code"]))
    cap = memory_fit.check(model, _profile("capture", H200, h200["sglang_extra_args"]))
    assert cap["mem_fraction_static"] == 0.78 and cap["kv"] == 262144 * 70272


def test_server_flags_and_the_sglang_reserve():
    f = memory_fit.server_flags(
        "python -m sglang.launch_server --tp 8 --mem-fraction-static=0.8 --context-length 4096"
    )
    assert f == {"tp_size": 8, "mem_fraction_static": 0.8, "context_length": 4096}
    with pytest.raises(memory_fit.MemoryFitError, match="--context-length 'lots': not a int"):
        memory_fit.server_flags(["--context-length", "lots"])
    # SGLang's rule: 512 + 1.5 a prefill token + 2 a graph size + 128 a rank (MiB), >= 10 GiB on a big card, + 2 GiB
    small = memory_fit.Profile("serve", 24576, 1, 4096, chunked_prefill_size=2048, cuda_graph_max_bs=8)
    assert memory_fit.sglang_reserve_mib(small) == 512 + 3072 + 16 + 128
    assert (
        memory_fit.sglang_reserve_mib(_profile("serve", RTX_PRO_6000, ["--cuda-graph-max-bs", "32"]))
        == 512 + 12288 + 64 + 1024 + 2048
    )


def _shard(path: Path, tensors: dict) -> None:
    save_file(tensors, str(path))


def _wrapper(tmp_path: Path) -> Path:
    """A Kimi-K2.5-shaped wrapper in two shards + index: language_model.* (an INT4-packed expert, an MLA
    down-projection, a norm) and vision_tower.*."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {"hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4, "kv_lora_rank": 512,
                        "qk_rope_head_dim": 64, "max_position_embeddings": 4096},
        "vision_config": {"hidden_size": 32},
    }))  # fmt: skip
    a = {
        "language_model.model.layers.1.mlp.experts.0.gate_proj.weight_packed": np.zeros((16, 8), np.int32),
        "language_model.model.layers.1.mlp.experts.0.gate_proj.weight_scale": np.zeros((16, 2), np.float16),
        "language_model.model.layers.1.mlp.gate.weight": np.zeros((4, 64), np.float16),
    }
    b = {
        "language_model.model.layers.0.self_attn.q_a_proj.weight": np.zeros((32, 64), np.float16),
        "language_model.model.norm.weight": np.zeros((64,), np.float16),
        "language_model.lm_head.weight": np.zeros((100, 64), np.float16),
        "vision_tower.blocks.0.weight": np.zeros((32, 32), np.float16),
    }
    _shard(d / "model-00001-of-00002.safetensors", a)
    _shard(d / "model-00002-of-00002.safetensors", b)
    wm = {k: "model-00001-of-00002.safetensors" for k in a} | {
        k: "model-00002-of-00002.safetensors" for k in b
    }
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return d


def test_model_memory_splits_a_wrapper_checkpoint_by_what_tp_shards(tmp_path):
    m = memory_fit.model_memory(_wrapper(tmp_path))
    # sharded: the INT4 expert (packed + scales) and lm_head; whole on every rank: router, q_a_proj, norm, vision
    assert m.sharded_bytes == 16 * 8 * 4 + 16 * 2 * 2 + 100 * 64 * 2
    assert m.replicated_bytes == (4 * 64 + 32 * 64 + 64 + 32 * 32) * 2
    assert (m.kv_latent, m.num_layers, m.hidden_size, m.max_positions) == (576, 8, 64, 4096)
    assert m.kv_bytes_per_token(8) == 576 * 2 * 8


def test_a_missing_or_truncated_shard_is_refused_naming_it(tmp_path):
    d = _wrapper(tmp_path)
    second = d / "model-00002-of-00002.safetensors"
    data = second.read_bytes()
    second.write_bytes(data[:-10])
    with pytest.raises(checkpoint_files.CheckpointError, match=r"00002-of-00002.safetensors: .* truncated"):
        checkpoint_files.tensors(d)
    second.unlink()
    with pytest.raises(
        checkpoint_files.CheckpointError, match=r"lists 2 shards but 1 are missing \(model-00002"
    ):
        checkpoint_files.tensors(d)


def _cli(*argv) -> tuple[int, dict]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = cli.main(["memory-fit", *map(str, argv), "--json"])
    return rc, json.loads(buf.getvalue().splitlines()[-1])


def test_the_cli_refuses_with_exit_2_and_skips_without_a_gpu(tmp_path, monkeypatch):
    d = _wrapper(tmp_path)
    monkeypatch.setattr(memory_fit, "gpu_memory_mib", lambda: None)  # a host where nvidia-smi answers no GPU
    rc, out = _cli("--model", d, "--server-args=--mem-fraction-static 0.99")
    assert rc == 0 and out["checked"] is False and "no GPU" in out["reason"], out
    small = "--tp 2 --mem-fraction-static 0.5 --chunked-prefill-size -1 --max-prefill-tokens 2048"
    rc, out = _cli("--model", d, "--gpu-memory-mib", 16384, f"--server-args={small}")
    assert rc == 0 and out["checked"] and out["profile"]["context_length"] == 4096, out
    assert out["reserve"] == (512 + 3072 + 1024 + 256) * 2**20 and out["capture"] == 2048 * 64 * 18, out
    rc, out = _cli(
        "--model", d, "--gpu-memory-mib", 16384, f"--server-args={small} --mem-fraction-static 0.99"
    )
    assert rc == 2 and "leaves 0.2 GiB a GPU outside it" in out["msg"], out
    assert "sglang_extra_args: --mem-fraction-static" in out["msg"] and out["reserve"] > out["headroom"]
    (d / "model-00001-of-00002.safetensors").unlink()
    rc, out = _cli("--model", d, "--gpu-memory-mib", 16384)
    assert rc == 2 and "are missing (model-00001-of-00002.safetensors)" in out["msg"]


def test_the_cli_checks_the_serving_server_as_the_serve_role_calls_it(tmp_path):
    """The serve role's call: ``--phase serve --draft DIR`` and the draft server's whole argv. The draft's
    weights count (their share a rank), SGLang's 2 GiB for speculative decoding counts, and a refusal names the
    serve phase's variable."""
    d = _wrapper(tmp_path)
    draft = tmp_path / "draft"
    draft.mkdir()
    _shard(draft / "model.safetensors", {"fc.weight": np.zeros((64, 192), np.float16)})
    argv = (
        f"/opt/sgl/bin/python -m sglang.launch_server --model-path {d} --tp-size 2 --trust-remote-code "
        f"--port 30000 --speculative-algorithm EAGLE3 --speculative-draft-model-path {draft} "
        "--context-length 4096 --chunked-prefill-size 2048 --cuda-graph-max-bs 8"
    )
    common = ("--model", d, "--phase", "serve", "--tp-size", 2, "--draft", draft, "--gpu-memory-mib", 16384)
    rc, out = _cli(*common, f"--server-args={argv} --mem-fraction-static 0.6")
    assert rc == 0 and out["checked"] and out["profile"]["speculative"], out
    draft_share = -(-(draft / "model.safetensors").stat().st_size // 2)
    assert out["weights"] == memory_fit.model_memory(d).weight_bytes_per_gpu(2) + draft_share
    assert out["reserve"] == (512 + 3072 + 16 + 256 + 2048) * 2**20 and out["capture"] == 0, out
    rc, out = _cli(*common, f"--server-args={argv} --mem-fraction-static 0.95")
    assert rc == 2 and "leaves 0.8 GiB a GPU outside it for reserve 5.8 GiB" in out["msg"], out
    assert "lower it to 0.63 (serve_mem_fraction_static)" in out["msg"] and out["phase"] == "serve", out


def test_a_checkpoint_without_a_decoder_is_refused_naming_the_phases_variable(tmp_path):
    """A vision tower alone (the wrapper's config, only vision tensors) and an encoder: the preflight the sglang
    and serve roles run before a server starts refuses them (exit 2) naming the variable that points at the
    model, instead of sizing a server that cannot run them."""
    d = tmp_path / "vision"
    d.mkdir()
    cfg = json.loads(_wrapper(tmp_path).joinpath("config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg))
    _shard(d / "model.safetensors", {"vision_tower.blocks.0.weight": np.zeros((32, 32), np.float16)})
    rc, out = _cli("--model", d, "--gpu-memory-mib", 16384, "--phase", "serve")
    assert rc == 2 and "no model.layers.0.* tensors" in out["msg"] and "serve_model_path" in out["msg"], out
    (d / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "hidden_size": 32}))
    rc, out = _cli("--model", d, "--gpu-memory-mib", 16384, "--phase", "capture")
    assert rc == 2 and "names ['BertModel']: not a decoder language model" in out["msg"], out
    assert "sglang_model_path" in out["msg"], out


def test_gpu_memory_is_the_smallest_card_nvidia_smi_reports():
    """nvidia-smi cannot run here: a stand-in runner answers as it does (one line a GPU, MiB)."""

    class Answer:
        def __init__(self, rc, out):
            self.returncode, self.stdout = rc, out

    assert memory_fit.gpu_memory_mib(lambda *a, **k: Answer(0, "97887\n97887\n97250\n")) == 97250
    assert memory_fit.gpu_memory_mib(lambda *a, **k: Answer(9, "")) is None

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    assert memory_fit.gpu_memory_mib(missing) is None

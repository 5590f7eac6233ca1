"""The SGLang version table (eagle3ops.sglang.versions) checked against each version's REAL wheel (0.5.17,
0.5.23; cached under tests/.artifacts/sglang/, read with zipfile/ast, never imported: SGLang's runtime needs CUDA).

What the in-server hook touches in SGLang is checked in the source of every version: the ForwardBatch fields and
ForwardMode methods it reads (the same names the test stand-in uses), the TP-rank function, the two model
attributes enable_capture sets (the ones set_eagle3_layers_to_capture sets), the aux-state packer layout, and
(0.5.17, whose final norm has no capture= argument) that the second value of ``self.norm(x, residual)`` is the
updated residual. The role's per-version variables equal the Python table.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from pathlib import Path

import pytest
import yaml
from eagle3ops.sglang import versions as sglang_versions
from eagle3ops.sglang.hook import DumpHook, HookError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
from sglang_standin import VERSIONS, StandInForwardBatch, StandInForwardMode, sglang_source

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(params=VERSIONS)
def version(request):
    return request.param


def _class(src: str, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef) and n.name == name)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == name)


def test_the_table_lists_exactly_the_tested_versions():
    assert sglang_versions.KNOWN == VERSIONS
    assert sglang_versions.DEFAULT_VERSION == "0.5.23"  # unchanged default


def test_an_unknown_version_is_refused_with_the_known_ones():
    with pytest.raises(sglang_versions.UnknownVersion, match=r"known versions: 0\.5\.17, 0\.5\.23"):
        sglang_versions.get("0.5.99")
    with pytest.raises(sglang_versions.UnknownVersion, match=r"0\.5\.17, 0\.5\.23"):
        sglang_versions.dump_capture_args("0.4.0", [2, 4, 5])


def test_the_hooks_forward_batch_fields_exist_in_the_real_source(version):
    """Every ForwardBatch field the hook reads (= the stand-in's fields) is declared on the real ForwardBatch,
    ``rids``/``extend_*_lens_cpu`` are filled from the batch's requests, and ForwardMode has the methods the hook
    calls, with TARGET_VERIFY inside is_extend (so the hook must exclude it, which it does)."""
    src = sglang_source("sglang/srt/model_executor/forward_batch_info.py", version)
    fb = _class(src, "ForwardBatch")
    declared = {
        n.target.id for n in fb.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    used = {f.name for f in dataclasses.fields(StandInForwardBatch)}
    assert used == {"rids", "extend_seq_lens_cpu", "extend_prefix_lens_cpu", "input_ids", "forward_mode"}
    assert used <= declared, used - declared
    assert "rids=[req.rid for req in batch.reqs]" in src
    assert re.search(r"ret\.extend_seq_lens_cpu = (list\()?extend_seq_lens", src)
    assert re.search(r"ret\.extend_prefix_lens_cpu = (list\()?extend_prefix_lens", src)
    mode = _class(src, "ForwardMode")
    methods = {f.name for f in mode.body if isinstance(f, ast.FunctionDef)}
    stand_in = {m for m in vars(StandInForwardMode) if m.startswith("is_")}
    assert stand_in <= methods, stand_in - methods
    is_extend = ast.unparse(_method(mode, "is_extend"))
    assert "ForwardMode.EXTEND" in is_extend and "ForwardMode.TARGET_VERIFY" in is_extend
    ps = sglang_source("sglang/srt/distributed/parallel_state.py", version)
    assert re.search(r"^def get_tensor_model_parallel_rank\(", ps, re.M)
    assert "from sglang.srt.distributed.parallel_state import *" in sglang_source(
        "sglang/srt/distributed/__init__.py", version
    )


def test_the_model_attributes_the_hook_uses_exist(version):
    """capture_aux_hidden_states / model.layers_to_capture (read by _check_model, set by enable_capture) are what
    set_eagle3_layers_to_capture sets; DeepseekV2Model captures layer i's input into an AuxHiddenStatePacker
    ([tokens, K*H], ascending ids); the CausalLM forward unpacks (hidden, aux) when capturing."""
    src = sglang_source("sglang/srt/models/deepseek_v2.py", version)
    causal = _class(src, "DeepseekV2ForCausalLM")
    setter = ast.unparse(_method(causal, "set_eagle3_layers_to_capture"))
    assert (
        "self.capture_aux_hidden_states = True" in setter
        and "self.model.layers_to_capture = list(layer_ids)" in setter
    )
    assert "self.capture_aux_hidden_states = False" in ast.unparse(_method(causal, "__init__"))
    fwd = ast.unparse(_method(causal, "forward"))
    assert "hidden_states, aux_hidden_states = hidden_states" in fwd
    model_fwd = ast.unparse(_method(_class(src, "DeepseekV2Model"), "forward"))
    assert re.search(
        r"AuxHiddenStatePacker(\.for_batch\(forward_batch, |\()len\(self\.layers_to_capture\)\)", model_fwd
    )
    assert "aux_hidden_states if i in self.layers_to_capture else None" in model_fwd
    packer = sglang_source("sglang/srt/layers/aux_hidden_states.py", version)
    assert re.search(r"\(\*\w+\.shape\[:-1\], feature_size \* self\._num_captures\)", packer)
    if version == "0.5.17":  # (0.5.23 moved this into layers/layer_boundary/; docs/sglang.md has its reading)
        comm = sglang_source("sglang/srt/layers/communicator.py", version)
        # the captured state is the residual after prepare_attn: the input of layer i (hidden + residual)
        fn = ast.unparse(
            _method(_class(comm, "LayerCommunicator"), "prepare_attn_and_capture_last_layer_outputs")
        )
        assert "self.prepare_attn(" in fn and "hidden_states=residual" in fn
        assert "captured_last_layer_outputs.append(gathered_last_layer_output)" in fn


def test_0_5_17_final_norm_returns_the_updated_residual():
    """0.5.17's patch calls the capture with the second value of ``self.norm(hidden_states, residual)``: the
    fused add+RMSNorm's updated residual (hidden + residual, before the norm), as 0.5.23's capture= gets it."""
    src = sglang_source("sglang/srt/models/deepseek_v2.py", "0.5.17")
    assert "final_norm(" not in ast.unparse(_method(_class(src, "DeepseekV2Model"), "forward"))
    ln = sglang_source("sglang/srt/layers/layernorm.py", "0.5.17")
    cuda = ast.unparse(_method(_class(ln, "RMSNorm"), "forward_cuda"))
    assert (
        "fused_add_rmsnorm(x, residual, self.weight.data, self.variance_epsilon)\nreturn (x, residual)"
        in ("\n".join(line.strip() for line in cuda.splitlines()))
    )
    native = ast.unparse(_method(_class(ln, "RMSNorm"), "forward_native"))
    assert "x = x + residual.to(torch.float32)" in native and "residual = x.to(orig_dtype)" in native
    assert "return (x, residual)" in native
    # 0.5.17 has no capture-only flag: aux capture comes from an EAGLE3 draft's config only
    spec = sglang_source(
        "sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py", "0.5.17"
    )
    assert "enable_return_aux_hidden_states" not in spec and "speculative_draft_model_path" in spec
    assert (
        not sglang_versions.get("0.5.17").capture_only_flag
        and sglang_versions.get("0.5.23").capture_only_flag
    )


class _Model:
    """STAND-IN for DeepseekV2ForCausalLM at construction: the attributes enable_capture touches."""

    def __init__(self, n_layers=8, last_rank=True):
        self.config = type("C", (), {"num_hidden_layers": n_layers})()
        self.pp_group = type("P", (), {"is_last_rank": last_rank})()
        self.model = type("M", (), {"layers_to_capture": []})()
        self.capture_aux_hidden_states = False


def test_enable_capture_sets_what_set_eagle3_layers_to_capture_sets(tmp_path):
    m = _Model()
    DumpHook(tmp_path, [2, 4, 5]).enable_capture(m)
    assert m.capture_aux_hidden_states is True and m.model.layers_to_capture == [2, 4, 5]
    m1 = _Model()
    DumpHook(tmp_path, [1, 4, 5]).enable_capture(m1)
    assert m1.model.layers_to_capture == [1, 4, 5]  # taken as given: no +1 shift
    other = _Model(last_rank=False)
    DumpHook(tmp_path, [2, 4, 5]).enable_capture(other)
    assert other.capture_aux_hidden_states is False
    with pytest.raises(HookError, match="past the model's 8 layers"):
        DumpHook(tmp_path, [2, 4, 8]).enable_capture(_Model())


def test_the_roles_version_variables_equal_the_table():
    """The sglang role keeps no copy of the table: its unit's capture flags are eagle3ops layer-ids' answer
    (``sglang_capture_args``, from dump_capture_args); the roles' version choices are the table's."""
    role = REPO / "roles/sglang"
    assert not (role / "vars/main.yml").exists()
    unit = (role / "templates/eagle3ops-sglang-extract.service.j2").read_text()
    assert "sglang_capture_args" in unit and "--enable-return-aux-hidden-states" not in unit
    layers_yml = (role / "tasks/layers.yml").read_text()
    assert "'--sglang-version', sglang_version" in layers_yml and ".sglang_capture_args" in layers_yml
    for role, var in (("sglang", "sglang_version"), ("extract", "extract_sglang_version")):
        spec = yaml.safe_load((REPO / f"roles/{role}/meta/argument_specs.yml").read_text())
        opt = spec["argument_specs"]["main"]["options"][var]
        assert opt["choices"] == list(sglang_versions.KNOWN) and opt["default"] == "0.5.23", role


def test_the_role_refuses_an_unknown_version_before_installing(tmp_path):
    """playbooks/sglang.yml for real (ansible-playbook, connection local): sglang_version 0.5.99 fails the role's
    argument validation, naming the known versions, and nothing is installed (the venv dir is never made)."""
    import json
    import os
    import subprocess

    bin_ = Path(sys.executable).parent
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"gpu_hosts": {"hosts": {"localhost": {"ansible_connection": "local"}}}}))
    venv = tmp_path / "sglang-venv"
    ev = {
        "sglang_version": "0.5.99",
        "sglang_enabled": True,
        "sglang_venv_dir": str(venv),
        "ansible_python_interpreter": sys.executable,
    }
    r = subprocess.run(
        [
            str(bin_ / "ansible-playbook"),
            "-i",
            str(inv),
            str(REPO / "playbooks/sglang.yml"),
            "-e",
            json.dumps(ev),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        timeout=600,
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "sglang_version" in out, out[-3000:]
    assert ", ".join(sglang_versions.KNOWN) in out and "0.5.99" in out, out[-3000:]
    assert not venv.exists()

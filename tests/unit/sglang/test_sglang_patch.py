"""The capture patch against the REAL deepseek_v2.py of every SGLang version eagle3ops knows (0.5.17, 0.5.23:
each from its own wheel, cached under tests/.artifacts/sglang/; see tests/fixtures/sglang_standin.py)."""

from __future__ import annotations

import ast
import hashlib
import json
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from eagle3ops.sglang import hook as sglang_hook
from eagle3ops.sglang import patch as sglang_patch
from eagle3ops.sglang.patch import PatchError
from eagle3ops.sglang.versions import KNOWN

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
from sglang_standin import VERSIONS, pristine_deepseek_v2, sglang_wheel

SPEC = sglang_patch.SPECS["0.5.23"]  # the default version, for the tests that need only one


@pytest.fixture(params=VERSIONS)
def version(request):
    return request.param


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def target(tmp_path, version):
    """A writable copy of the upstream file laid out like an install (site-packages/sglang/srt/models/)."""
    dst = tmp_path / "site-packages" / sglang_patch.TARGET_RELPATH
    dst.parent.mkdir(parents=True)
    shutil.copy2(pristine_deepseek_v2(version), dst)
    return dst


def test_every_known_version_has_a_patch():
    from eagle3ops.sglang import versions as sglang_versions

    assert set(sglang_patch.SPECS) == set(sglang_versions.VERSIONS) == set(VERSIONS)
    assert all(v == s.sglang_version for v, s in sglang_patch.SPECS.items())


def test_the_cached_upstream_file_is_the_one_the_patch_was_written_for(version):
    assert _sha(pristine_deepseek_v2(version)) == sglang_patch.SPECS[version].pristine_sha256


def test_apply_compiles_is_detected_idempotent_and_restores_byte_exact(target, tmp_path, version):
    SPEC = sglang_patch.SPECS[version]
    assert sglang_patch.status(target, version)["state"] == "pristine"
    mode = target.stat().st_mode
    pristine_mtime = target.stat().st_mtime_ns

    # check mode predicts the change and touches nothing
    pred = sglang_patch.apply(target, version, check=True, diff=True)
    assert pred["changed"] is True and _sha(target) == SPEC.pristine_sha256
    assert "+            _eagle3ops_hook.on_forward(self, forward_batch, aux_hidden_states)" in pred["diff"]
    assert not sglang_patch.backup_path(target).exists()

    res = sglang_patch.apply(target, version)
    assert res["changed"] is True and res["state"] == "applied"
    assert _sha(target) == SPEC.patched_sha256 and target.stat().st_mode == mode
    py_compile.compile(str(target), cfile=str(tmp_path / "patched.pyc"), doraise=True)
    st = sglang_patch.status(target, version)
    assert st["applied"] is True and st["backup"] == str(sglang_patch.backup_path(target))

    again = sglang_patch.apply(target, version)
    assert again["changed"] is False and again["state"] == "applied"

    pred = sglang_patch.restore(target, version, check=True)
    assert pred["changed"] is True and _sha(target) == SPEC.patched_sha256

    back = sglang_patch.restore(target, version)
    assert back["changed"] is True and back["restored_from"] == "backup"
    assert target.read_bytes() == pristine_deepseek_v2(version).read_bytes()
    assert target.stat().st_mtime_ns == pristine_mtime  # the pristine .pyc stays valid
    assert sglang_patch.restore(target, version)["changed"] is False


def test_restore_without_the_kept_copy_reverses_the_hunks(target, version):
    sglang_patch.apply(target, version)
    sglang_patch.backup_path(target).unlink()
    res = sglang_patch.restore(target, version)
    assert res["restored_from"] == "reversed hunks"
    assert _sha(target) == sglang_patch.SPECS[version].pristine_sha256


def test_a_damaged_kept_copy_is_not_used(target, version):
    sglang_patch.apply(target, version)
    sglang_patch.backup_path(target).write_text("garbage")
    assert sglang_patch.restore(target, version)["restored_from"] == "reversed hunks"
    assert _sha(target) == sglang_patch.SPECS[version].pristine_sha256


def test_a_modified_upstream_file_is_refused_and_left_alone(target, version):
    SPEC = sglang_patch.SPECS[version]
    text = target.read_text().replace(
        "logger = logging.getLogger(__name__)", "logger = logging.getLogger('x')"
    )
    target.write_text(text)
    before = target.read_bytes()
    with pytest.raises(PatchError) as ei:
        sglang_patch.apply(target, version)
    msg = str(ei.value)
    assert str(target) in msg and _sha(target) in msg and SPEC.pristine_sha256 in msg
    assert f"sglang=={version}" in msg and "Nothing was changed" in msg
    assert target.read_bytes() == before and not sglang_patch.backup_path(target).exists()
    assert sglang_patch.status(target, version)["state"] == "unknown"
    with pytest.raises(PatchError, match="refusing to restore"):
        sglang_patch.restore(target, version)


def test_the_patched_calls_name_the_hooks_real_api(target, version):
    """Parse the patched file: every call on ``_eagle3ops_hook`` is a DumpHook method, the import exists,
    and the calls sit in the methods the hunks claim: the final norm (0.5.23: its capture=; 0.5.17: called with
    the norm's updated residual) and the CausalLM forward; 0.5.17 also turns the capture on in __init__. The
    attributes enable_capture sets are the ones SGLang's own set_eagle3_layers_to_capture sets."""
    sglang_patch.apply(target, version)
    tree = ast.parse(target.read_text())
    imported = [
        a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "eagle3ops.sglang_hook"
        for a in n.names
    ]
    assert imported == ["active_hook"] and callable(sglang_hook.active_hook)
    calls = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "_eagle3ops_hook"
                ):
                    calls[(cls.name, fn.name)] = (node.func.attr, len(node.args))
    expected = {
        ("DeepseekV2Model", "forward"): ("capture_last", 1),
        ("DeepseekV2ForCausalLM", "forward"): ("on_forward", 3),
    }
    if version == "0.5.17":
        expected[("DeepseekV2ForCausalLM", "__init__")] = ("enable_capture", 1)
    assert calls == expected
    for method, _n in expected.values():
        assert callable(getattr(sglang_hook.DumpHook, method))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV2ForCausalLM")
    setter = ast.unparse(
        next(f for f in cls.body if getattr(f, "name", "") == "set_eagle3_layers_to_capture")
    )
    assert "self.capture_aux_hidden_states = True" in setter and "self.model.layers_to_capture =" in setter
    # the final norm's pre-norm state: 0.5.23 hands its capture= the updated residual; in 0.5.17 the callback
    # gets the second value of self.norm(hidden_states, residual) (RMSNorm's updated residual)
    src = target.read_text()
    model = ast.get_source_segment(
        src, next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV2Model")
    )
    if version == "0.5.17":
        assert (
            "hidden_states, _ = self.norm(hidden_states, residual)\n                    if _eagle3ops_capture"
            in model
        )
        assert "_eagle3ops_capture(_)" in model and "_eagle3ops_capture(hidden_states)" in model
    else:
        assert "capture=_eagle3ops_hook.capture_last(forward_batch)" in model


def test_cli_status_apply_restore(target, version):
    SPEC = sglang_patch.SPECS[version]

    def cli(*args):
        base = [sys.executable, "-m", "eagle3ops", "sglang-patch"]
        r = subprocess.run(
            [*base, *args, "--file", str(target), "--json", "--sglang-version", version],
            capture_output=True,
            text=True,
        )
        return r.returncode, json.loads(r.stdout.strip().splitlines()[-1])

    rc, out = cli("status")
    assert rc == 0 and out["state"] == "pristine" and out["sglang_version"] == version
    rc, out = cli("apply", "--check", "--diff")
    assert (
        rc == 0
        and out["changed"] is True
        and "eagle3ops" in out["diff"]
        and _sha(target) == SPEC.pristine_sha256
    )
    rc, out = cli("apply")
    assert rc == 0 and out["changed"] is True and out["state"] == "applied"
    rc, out = cli("apply")
    assert rc == 0 and out["changed"] is False
    rc, out = cli("restore")
    assert rc == 0 and out["changed"] is True and _sha(target) == SPEC.pristine_sha256
    target.write_text(target.read_text() + "\n# local edit\n")
    rc, out = cli("apply")
    assert rc == 2 and out["failed"] is True and out["expected_sha256"] == SPEC.pristine_sha256


def test_the_other_versions_file_is_refused(tmp_path):
    """0.5.17's file under the 0.5.23 patch (and the reverse): refused by sha256, named, untouched."""
    for have, ask in (("0.5.17", "0.5.23"), ("0.5.23", "0.5.17")):
        f = tmp_path / have / "deepseek_v2.py"
        f.parent.mkdir()
        shutil.copy2(pristine_deepseek_v2(have), f)
        with pytest.raises(PatchError) as ei:
            sglang_patch.apply(f, ask)
        assert str(f) in str(ei.value) and f"sglang=={ask}" in str(ei.value)
        assert _sha(f) == sglang_patch.SPECS[have].pristine_sha256
        assert sglang_patch.status(f, ask)["state"] == "unknown"


def test_an_unknown_version_is_refused_with_the_known_ones(tmp_path):
    f = tmp_path / "deepseek_v2.py"
    shutil.copy2(pristine_deepseek_v2(), f)
    with pytest.raises(PatchError, match=r"'0\.5\.99' is not supported .*known versions: 0\.5\.17, 0\.5\.23"):
        sglang_patch.apply(f, "0.5.99")
    for cmd in (
        ["sglang-patch", "status", "--file", str(f)],
        ["extract-sglang", "--data", "d", "--model", "m"],
    ):
        r = subprocess.run(
            [sys.executable, "-m", "eagle3ops", *cmd, "--sglang-version", "0.5.99", "--json"],
            capture_output=True,
            text=True,
        )
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert out["known"] == list(KNOWN) and ", ".join(KNOWN) in out["msg"], out
    assert _sha(f) == SPEC.pristine_sha256


def _server_fields(version: str) -> str:
    """ServerArgs' field declarations of the real wheel (0.5.23: arg_groups/fields/*.py; 0.5.17: server_args.py)."""
    import zipfile

    from eagle3ops.sglang import versions as sglang_versions

    where = sglang_versions.get(version).server_args_files
    with zipfile.ZipFile(sglang_wheel(version)) as z:
        return "\n".join(
            z.read(n).decode()
            for n in z.namelist()
            if n.endswith(".py") and any(n == w or (w.endswith("/") and n.startswith(w)) for w in where)
        )


def _render_unit(version: str, trust_remote_code: bool = True) -> str:
    """The role's extraction unit rendered with jinja2 (Ansible's engine) for ``version``, with the ids and
    capture flags the role takes from ``eagle3ops layer-ids --sglang --sglang-version`` (roles/sglang/tasks/
    layers.yml), run here on an 8-layer config."""
    import tempfile

    import jinja2
    import yaml
    from ansible.module_utils.parsing.convert_bool import boolean

    role = Path(__file__).resolve().parents[3] / "roles/sglang"
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["bool"] = boolean  # Ansible's own, the one filter the unit template uses
    tpl = env.from_string((role / "templates/eagle3ops-sglang-extract.service.j2").read_text())
    with tempfile.TemporaryDirectory() as model:
        (Path(model) / "config.json").write_text(json.dumps({"num_hidden_layers": 8}))
        r = subprocess.run(
            [
                *(sys.executable, "-m", "eagle3ops", "layer-ids", "--model", model, "--ids", "2", "4", "5"),
                *("--sglang", "--sglang-version", version, "--json"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    answer = json.loads(r.stdout.strip().splitlines()[-1])
    vars_ = yaml.safe_load((role / "defaults/main.yml").read_text())
    vars_.update(
        sglang_version=version,
        ansible_managed="managed",
        sglang_resolved_layer_ids=answer["layer_ids"],
        sglang_capture_args=answer["sglang_capture_args"],
        sglang_dump_data_dir="/data",
        sglang_trust_remote_code=trust_remote_code,  # on: the flag is checked against the version's fields too
    )
    # one server (roles/sglang/tasks/servers.yml's list for sglang_servers: 1)
    server = {"unit": "eagle3ops-sglang-extract", "port": 30000, "gpus": [], "manifest_rank": 0}
    return tpl.render(**vars_, sglang_server_list=[server], sglang_server=server)


def test_the_server_flags_exist_in_each_sglang_version(version):
    """Every flag of the dump server (client helper and the role's unit, rendered for the version) is a CLI field
    of that version's real ServerArgs (``--x-y`` is field ``x_y``, not ``no_cli``). 0.5.17 has no capture-only
    flag: the dump server passes none (the patch turns the capture on), 0.5.23 passes its three."""
    import re

    from eagle3ops.sglang.client import server_args

    fields = _server_fields(version)
    unit = _render_unit(version)
    # the unit is rendered with sglang_trust_remote_code true: the client helper gets the flag as an extra
    cli = server_args(
        model_path="m", layer_ids=[2, 4, 5], sglang_version=version, extra=["--trust-remote-code"]
    )
    flags = {a for a in cli if a.startswith("--")}
    unit_flags = set(re.findall(r"(--[a-z][a-z0-9-]+)", unit.split("ExecStart=", 1)[1]))
    assert unit_flags == flags, (unit_flags, flags)  # the role's unit and the client helper agree
    assert {"--disable-radix-cache", "--disable-prefill-cuda-graph", "--chunked-prefill-size"} <= flags
    capture = {"--enable-return-aux-hidden-states", "--return-aux-hidden-state-layer-ids"}
    if version == "0.5.17":
        assert not capture & flags and "enable_return_aux_hidden_states" not in fields
    else:
        assert capture <= flags and "EAGLE3" in cli
    for flag in sorted(flags):
        name = flag[2:].replace("-", "_")
        m = re.search(rf"^    {name}: A\[(.*?)\n    \] = |^    {name}: A\[[^\n]*\] = ", fields, re.M | re.S)
        assert m, f"{flag}: no field {name} in sglang {version}'s ServerArgs"
        assert "no_cli=True" not in m.group(0), f"{flag} is not a command-line option in {version}"


def test_the_capture_server_gets_trust_remote_code_exactly_when_set():
    """sglang_trust_remote_code (the shared eagle3ops_trust_remote_code) puts --trust-remote-code on the capture
    server's command line, so SGLang loads the target's own tokenizer code as every other phase does; off, the
    flag is absent (a remote-code target is then refused by the phases that load it)."""
    for version in KNOWN:
        on = _render_unit(version).split("ExecStart=", 1)[1].split()
        off = _render_unit(version, trust_remote_code=False).split("ExecStart=", 1)[1].split()
        assert on.count("--trust-remote-code") == 1 and "--trust-remote-code" not in off, version
        assert [a for a in on if a != "--trust-remote-code"] == off, version


def test_module_returns_the_patch_state_beside_ansibles_file_state(tmp_path):
    """library/eagle3ops_sglang_patch.py through the real `ansible` ad-hoc runner on a copy of the real 0.5.23 file:
    AnsibleModule writes file info (`state: file`) over a result's `state` when it has `path`, so the patch state
    must come back as `patch_state`/`applied` (and the fact), never only as `state`."""
    import os

    target = tmp_path / "deepseek_v2.py"
    shutil.copy2(pristine_deepseek_v2(), target)
    repo = Path(__file__).resolve().parents[3]
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(repo / "ansible.cfg"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
    )

    def adhoc(state: str, *extra: str) -> dict:
        args = f"path={target} state={state} executable={Path(sys.executable).parent / 'eagle3ops'}"
        r = subprocess.run(
            [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-m", "eagle3ops_sglang_patch",
             "-a", args, "-e", f"ansible_python_interpreter={sys.executable}", *extra],
            capture_output=True, text=True, cwd=repo, env=env, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return json.loads(r.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]

    predicted = adhoc("present", "--check")
    assert predicted["changed"] and predicted["patch_state"] == "applied" and predicted["applied"] is True
    assert hashlib.sha256(target.read_bytes()).hexdigest() == SPEC.pristine_sha256  # check mode wrote nothing
    applied = adhoc("present")
    assert applied["changed"] and applied["patch_state"] == "applied" and applied["applied"] is True
    assert applied["ansible_facts"]["eagle3ops_sglang_patch"]["state"] == "applied"
    assert applied["state"] == "file"  # Ansible's, documented in RETURN
    restored = adhoc("absent")
    assert restored["changed"] and restored["patch_state"] == "pristine" and restored["applied"] is False
    assert hashlib.sha256(target.read_bytes()).hexdigest() == SPEC.pristine_sha256

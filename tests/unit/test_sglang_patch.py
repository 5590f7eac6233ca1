"""The capture patch against the REAL sglang 0.5.23 deepseek_v2.py (from the wheel; see tests/fixtures)."""

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
from eagle3ops import sglang_hook, sglang_patch
from eagle3ops.sglang_patch import PatchError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from sglang_standin import pristine_deepseek_v2

SPEC = sglang_patch.SPECS["0.5.23"]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def target(tmp_path):
    """A writable copy of the upstream file laid out like an install (site-packages/sglang/srt/models/)."""
    dst = tmp_path / "site-packages" / sglang_patch.TARGET_RELPATH
    dst.parent.mkdir(parents=True)
    shutil.copy2(pristine_deepseek_v2(), dst)
    return dst


def test_the_cached_upstream_file_is_the_one_the_patch_was_written_for():
    assert _sha(pristine_deepseek_v2()) == SPEC.pristine_sha256


def test_apply_compiles_is_detected_idempotent_and_restores_byte_exact(target, tmp_path):
    assert sglang_patch.status(target)["state"] == "pristine"
    mode = target.stat().st_mode
    pristine_mtime = target.stat().st_mtime_ns

    # check mode predicts the change and touches nothing
    pred = sglang_patch.apply(target, check=True, diff=True)
    assert pred["changed"] is True and _sha(target) == SPEC.pristine_sha256
    assert "+            _eagle3ops_hook.on_forward(self, forward_batch, aux_hidden_states)" in pred["diff"]
    assert not sglang_patch.backup_path(target).exists()

    res = sglang_patch.apply(target)
    assert res["changed"] is True and res["state"] == "applied"
    assert _sha(target) == SPEC.patched_sha256 and target.stat().st_mode == mode
    py_compile.compile(str(target), cfile=str(tmp_path / "patched.pyc"), doraise=True)
    st = sglang_patch.status(target)
    assert st["applied"] is True and st["backup"] == str(sglang_patch.backup_path(target))

    again = sglang_patch.apply(target)
    assert again["changed"] is False and again["state"] == "applied"

    pred = sglang_patch.restore(target, check=True)
    assert pred["changed"] is True and _sha(target) == SPEC.patched_sha256

    back = sglang_patch.restore(target)
    assert back["changed"] is True and back["restored_from"] == "backup"
    assert target.read_bytes() == pristine_deepseek_v2().read_bytes()
    assert target.stat().st_mtime_ns == pristine_mtime  # the pristine .pyc stays valid
    assert sglang_patch.restore(target)["changed"] is False


def test_restore_without_the_kept_copy_reverses_the_hunks(target):
    sglang_patch.apply(target)
    sglang_patch.backup_path(target).unlink()
    res = sglang_patch.restore(target)
    assert res["restored_from"] == "reversed hunks"
    assert _sha(target) == SPEC.pristine_sha256


def test_a_damaged_kept_copy_is_not_used(target):
    sglang_patch.apply(target)
    sglang_patch.backup_path(target).write_text("garbage")
    assert sglang_patch.restore(target)["restored_from"] == "reversed hunks"
    assert _sha(target) == SPEC.pristine_sha256


def test_a_modified_upstream_file_is_refused_and_left_alone(target):
    text = target.read_text().replace(
        "logger = logging.getLogger(__name__)", "logger = logging.getLogger('x')"
    )
    target.write_text(text)
    before = target.read_bytes()
    with pytest.raises(PatchError) as ei:
        sglang_patch.apply(target)
    msg = str(ei.value)
    assert str(target) in msg and _sha(target) in msg and SPEC.pristine_sha256 in msg
    assert "sglang==0.5.23" in msg and "Nothing was changed" in msg
    assert target.read_bytes() == before and not sglang_patch.backup_path(target).exists()
    assert sglang_patch.status(target)["state"] == "unknown"
    with pytest.raises(PatchError, match="refusing to restore"):
        sglang_patch.restore(target)


def test_the_patched_calls_name_the_hooks_real_api(target):
    """Parse the patched file: every call on ``_eagle3ops_hook`` is a DumpHook method, the import exists,
    and the calls sit in the two methods the hunks claim (the final norm's capture= and the CausalLM forward)."""
    sglang_patch.apply(target)
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
    assert calls == {
        ("DeepseekV2Model", "forward"): ("capture_last", 1),
        ("DeepseekV2ForCausalLM", "forward"): ("on_forward", 3),
    }
    assert callable(sglang_hook.DumpHook.capture_last) and callable(sglang_hook.DumpHook.on_forward)


def test_cli_status_apply_restore(target):
    def cli(*args):
        r = subprocess.run(
            [sys.executable, "-m", "eagle3ops", "sglang-patch", *args, "--file", str(target), "--json"],
            capture_output=True,
            text=True,
        )
        return r.returncode, json.loads(r.stdout.strip().splitlines()[-1])

    rc, out = cli("status")
    assert rc == 0 and out["state"] == "pristine"
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


def test_the_server_flags_exist_in_sglang_0_5_23():
    """Every flag of the dump server (client helper and the role's unit template) is a CLI field of the real
    0.5.23 ServerArgs (``sglang/srt/arg_groups/fields/*.py``: ``--x-y`` is field ``x_y``, not ``no_cli``)."""
    import re
    import zipfile

    from eagle3ops.sglang_client import server_args
    from sglang_standin import _find_wheel

    with zipfile.ZipFile(_find_wheel()) as z:
        fields = "\n".join(
            z.read(n).decode()
            for n in z.namelist()
            if n.startswith("sglang/srt/arg_groups/fields/") and n.endswith(".py")
        )
    template = (
        Path(__file__).resolve().parents[2] / "roles/sglang/templates/eagle3ops-sglang-extract.service.j2"
    ).read_text()
    flags = {a for a in server_args(model_path="m", layer_ids=[2, 4, 5]) if a.startswith("--")}
    flags |= set(re.findall(r"(--[a-z][a-z0-9-]+)", template.split("ExecStart=", 1)[1]))
    assert {
        "--disable-radix-cache",
        "--disable-prefill-cuda-graph",
        "--return-aux-hidden-state-layer-ids",
    } <= flags
    for flag in sorted(flags):
        name = flag[2:].replace("-", "_")
        m = re.search(rf"^    {name}: A\[(.*?)\n    \] = |^    {name}: A\[[^\n]*\] = ", fields, re.M | re.S)
        assert m, f"{flag}: no field {name} in sglang 0.5.23's ServerArgs"
        assert "no_cli=True" not in m.group(0), f"{flag} is not a command-line option in 0.5.23"


def test_module_returns_the_patch_state_beside_ansibles_file_state(tmp_path):
    """library/sglang_capture_patch.py through the real `ansible` ad-hoc runner on a copy of the real 0.5.23 file:
    AnsibleModule writes file info (`state: file`) over a result's `state` when it has `path`, so the patch state
    must come back as `patch_state`/`applied` (and the fact), never only as `state`."""
    import os

    target = tmp_path / "deepseek_v2.py"
    shutil.copy2(pristine_deepseek_v2(), target)
    repo = Path(__file__).resolve().parents[2]
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(repo / "ansible.cfg"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
    )

    def adhoc(state: str, *extra: str) -> dict:
        args = f"path={target} state={state} executable={Path(sys.executable).parent / 'eagle3ops'}"
        r = subprocess.run(
            [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-m", "sglang_capture_patch",
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

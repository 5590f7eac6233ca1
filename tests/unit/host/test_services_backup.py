"""python/eagle3ops/host/services.py without systemd: backup/restore of unit files, records, NVIDIA holder scan.

systemctl is replaced by a small fake (a dict of unit properties) — a stand-in; the real systemd path is
proven on nspawn hosts in tests/hosts/test_services.py. Files, symlinks and the /proc-like tree are real.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from eagle3ops.host import services as s


class FakeSystemctl:
    """Answers `show` from a dict and `list-unit-files`/`list-units` from the dict's keys."""

    def __init__(self, units: dict[str, dict]):
        self.units = units

    def __call__(self, *args):
        if args[0] == "show":
            unit = args[-1]
            props = self.units.get(unit, {"LoadState": "not-found", "ActiveState": "inactive"})
            out = "".join(f"{k}={v}\n" for k, v in {"Id": unit, **props}.items())
        else:
            out = "".join(f"{u} {p.get('UnitFileState', 'enabled')}\n" for u, p in self.units.items())
        return subprocess.CompletedProcess(args, 0, out, "")


def _dirs(tmp_path):
    etc, backup = tmp_path / "etc", tmp_path / "backup"
    etc.mkdir()
    return str(etc), str(backup)


def test_move_aside_and_restore_file_byte_exact(tmp_path):
    etc, backup = _dirs(tmp_path)
    unit = os.path.join(etc, "vllm.service")
    data = b"[Service]\nExecStart=/bin/sleep infinity\n# trailing bytes \xe2\x9c\x93 no newline"
    Path(unit).write_bytes(data)
    os.chmod(unit, 0o640)
    os.utime(unit, (1_000_000, 1_000_000))

    assert s.move_aside("vllm.service", backup, etc_dir=etc, check=True)["changed"] is True
    assert os.path.exists(unit), "check mode moved the file"
    r = s.move_aside("vllm.service", backup, etc_dir=etc)
    assert r["changed"] and r["kind"] == "file" and not os.path.exists(unit)
    bak = s.backup_path("vllm.service", backup)
    assert Path(bak).read_bytes() == data
    assert s.move_aside("vllm.service", backup, etc_dir=etc)["changed"] is False  # idempotent

    os.symlink("/dev/null", unit)  # what `systemctl mask` leaves there
    with pytest.raises(s.ServicesError, match="unmask"):
        s.restore("vllm.service", backup, etc_dir=etc)
    os.unlink(unit)
    assert s.restore("vllm.service", backup, etc_dir=etc)["changed"] is True
    assert Path(unit).read_bytes() == data
    st = os.stat(unit)
    assert (st.st_mode & 0o777, int(st.st_mtime)) == (0o640, 1_000_000)
    assert not os.path.exists(bak)
    assert s.restore("vllm.service", backup, etc_dir=etc)["changed"] is False


def test_restore_never_overwrites_a_different_file(tmp_path):
    etc, backup = _dirs(tmp_path)
    unit = os.path.join(etc, "vllm.service")
    Path(unit).write_text("old\n")
    s.move_aside("vllm.service", backup, etc_dir=etc)
    Path(unit).write_text("somebody's new unit\n")
    with pytest.raises(s.ServicesError, match="differs from the backup"):
        s.restore("vllm.service", backup, etc_dir=etc)
    assert Path(unit).read_text() == "somebody's new unit\n"
    assert os.path.exists(s.backup_path("vllm.service", backup))


def test_linked_unit_is_backed_up_as_symlink_at_record_time(tmp_path):
    etc, backup = _dirs(tmp_path)
    os.symlink("/opt/vllm/vllm.service", os.path.join(etc, "vllm.service"))
    fake = FakeSystemctl({"vllm.service": {"LoadState": "loaded", "ActiveState": "active",
                                            "UnitFileState": "linked"}})  # fmt: skip
    changed, rec = s.record("vllm.service", backup, systemctl=fake, etc_dir=etc)
    assert changed and rec["etc_entry"] == "link" and rec["was_active"] and not rec["was_masked"]
    assert os.readlink(s.backup_path("vllm.service", backup)) == "/opt/vllm/vllm.service"
    # `systemctl disable` removes the link before move_aside runs: nothing left to move, backup kept
    os.unlink(os.path.join(etc, "vllm.service"))
    assert s.move_aside("vllm.service", backup, etc_dir=etc)["changed"] is False
    assert s.restore("vllm.service", backup, etc_dir=etc)["changed"] is True
    assert os.readlink(os.path.join(etc, "vllm.service")) == "/opt/vllm/vllm.service"


def test_record_first_one_wins_and_forget(tmp_path):
    etc, backup = _dirs(tmp_path)
    fake = FakeSystemctl(
        {"vllm.service": {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled"}}
    )
    assert s.record("vllm.service", backup, systemctl=fake, etc_dir=etc, check=True)[0] is True
    assert s.read_record("vllm.service", backup) is None, "check mode wrote a record"
    s.record("vllm.service", backup, systemctl=fake, etc_dir=etc)
    fake.units["vllm.service"] = {"LoadState": "masked", "ActiveState": "inactive", "UnitFileState": "masked"}
    changed, rec = s.record("vllm.service", backup, systemctl=fake, etc_dir=etc)
    assert not changed and rec["was_enabled"] and rec["was_active"]
    assert s.list_records(backup) == ["vllm.service"]
    assert s.forget("vllm.service", backup) is True
    assert s.list_records(backup) == [] and s.forget("vllm.service", backup) is False


def test_corrupt_record_names_the_file(tmp_path):
    _, backup = _dirs(tmp_path)
    os.makedirs(backup)
    Path(os.path.join(backup, "vllm.service.json")).write_text("{not json")
    with pytest.raises(s.ServicesError, match=r"vllm\.service\.json is not valid JSON"):
        s.read_record("vllm.service", backup)


def test_expand_units_names_patterns_templates():
    fake = FakeSystemctl({"vllm.service": {}, "vllm-2.service": {}, "vllm@.service": {}, "vllm@0.service": {},
                          "ssh.service": {}})  # fmt: skip
    assert s.expand_units(["vllm*.service", "ghost"], systemctl=fake) == [
        "ghost.service", "vllm-2.service", "vllm.service", "vllm@0.service",
    ]  # fmt: skip
    assert s.normalize("vllm") == "vllm.service" and s.normalize("x.timer") == "x.timer"


def test_nvidia_holders_from_a_proc_tree(tmp_path):
    proc = tmp_path / "proc"
    for pid, target, cgroup, comm in (
        ("101", "/dev/nvidia0", "0::/system.slice/vllm.service\n", "python3"),
        ("202", "/dev/nvidiactl", "12:devices:/system.slice/jupyter.service\n", "jupyter"),
        ("303", "/dev/null", "0::/system.slice/ssh.service\n", "sshd"),
    ):
        (proc / pid / "fd").mkdir(parents=True)
        os.symlink(target, proc / pid / "fd" / "3")
        (proc / pid / "cgroup").write_text(cgroup)
        (proc / pid / "comm").write_text(comm + "\n")
        (proc / pid / "cmdline").write_bytes(comm.encode() + b"\0--flag\0")
    (proc / "self").mkdir()
    got = s.nvidia_holders(str(proc), exclude_units=["vllm"])
    assert got == [{"pid": 202, "comm": "jupyter", "cmdline": "jupyter --flag", "unit": "jupyter.service",
                    "devices": ["/dev/nvidiactl"]}]  # fmt: skip
    assert [h["pid"] for h in s.nvidia_holders(str(proc))] == [101, 202]
    # the role's report prints them in one line (services_info.holders_line)
    assert s.holders_line(s.nvidia_holders(str(proc))) == (
        "pid 101 (python3, unit vllm.service: /dev/nvidia0); pid 202 (jupyter, unit jupyter.service: /dev/nvidiactl)"
    )


def test_gather_reports_records_and_etc_entries(tmp_path):
    etc, backup = _dirs(tmp_path)
    Path(os.path.join(etc, "vllm.service")).write_text("x\n")
    fake = FakeSystemctl(
        {"vllm.service": {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled"}}
    )
    s.record("vllm.service", backup, systemctl=fake, etc_dir=etc)
    g = s.gather(["vllm"], backup, etc_dir=etc, proc=str(tmp_path), systemctl=fake, run_dir=str(tmp_path))
    assert g["systemd_running"] is True
    (u,) = g["units"]
    assert u["etc_entry"] == "file" and u["running"] and not u["masked"] and u["record"]["was_enabled"]
    assert g["recorded_names"] == ["vllm.service"] and g["holders"] == []
    assert json.loads(json.dumps(g)) == g  # module results must be JSON-serialisable


def test_gather_without_systemd_returns_no_units(tmp_path):
    """A host whose init is not systemd (this CI box, the local default): nothing can start a unit."""
    fake = FakeSystemctl({"vllm.service": {"LoadState": "loaded", "ActiveState": "active"}})
    g = s.gather(
        ["vllm"], str(tmp_path / "b"), proc=str(tmp_path), systemctl=fake, run_dir=str(tmp_path / "no")
    )
    assert g["systemd_running"] is False and g["units"] == [] and g["holders"] == []

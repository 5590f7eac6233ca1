"""Run a playbook through ansible-runner against test hosts and return per-host stats.

``run_playbook("playbooks/services.yml", host.inventory)`` -> :class:`PlaybookResult`, whose
``stats[host]`` holds ``ok / changed / failed / unreachable / skipped / rescued / ignored`` counts.
The tests assert on these (e.g. ``changed == 0`` on a second run).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCAL_INVENTORY = REPO / "inventory" / "local"  # the embedded local default (this machine)
# extract_poll_interval of the multi-host and SGLang extraction tests: each poll is a module and a CLI run on the
# host, CPU the 2-core suite lacks (1 s before; docs/conventions.md, "Session 18")
EXTRACT_POLL_S = 3


def cpu_extract_vars(model_path) -> dict:
    """The extract role's variables of the multi-host extraction tests on this machine: the tiny model on CPU, one
    row per batch (byte identity with a one-host reference needs the same batch shapes), one writer thread."""
    return {
        "extract_model_path": str(model_path),
        "extract_device": "cpu",
        "extract_max_batch_tokens": 1,
        "extract_writer_threads": 1,
        "extract_poll_interval": EXTRACT_POLL_S,
    }


_STAT_KEYS = {
    "ok": "ok",
    "changed": "changed",
    "failures": "failed",
    "dark": "unreachable",
    "skipped": "skipped",
    "rescued": "rescued",
    "ignored": "ignored",
}


@dataclass
class PlaybookResult:
    rc: int
    status: str
    stats: dict[str, dict[str, int]]
    stdout: str
    events: list = field(repr=False, default_factory=list)

    def host(self, name: str) -> dict[str, int]:
        return self.stats.get(name, dict.fromkeys(_STAT_KEYS.values(), 0))

    def changed_tasks(self, host: str | None = None) -> list[str]:
        """Names of the tasks that reported changed (on ``host`` or any host): for assertion messages."""
        out = []
        for ev in self.events:
            if ev.get("event") != "runner_on_ok":
                continue
            data = ev.get("event_data", {})
            if host and data.get("host") != host:
                continue
            if (data.get("res") or {}).get("changed"):
                out.append(f"{data.get('host')}: {data.get('task')}")
        return out

    def task_results(self, task: str, host: str | None = None) -> list[dict]:
        """The module results of every run of the task named ``task``."""
        out = []
        for ev in self.events:
            data = ev.get("event_data", {})
            if (
                ev.get("event", "") in ("runner_on_ok", "runner_on_failed", "runner_on_skipped")
                and data.get("task") == task
                and (host is None or data.get("host") == host)
            ):
                out.append(data.get("res") or {})
        return out

    def failures(self) -> list[str]:
        """``host: task: msg`` of every failed task (the output tail may have scrolled past them)."""
        out = []
        for ev in self.events:
            if ev.get("event") not in ("runner_on_failed", "runner_on_unreachable"):
                continue
            data = ev.get("event_data", {})
            res = data.get("res") or {}
            msg = str(res.get("msg") or res.get("stderr") or res)[:1500]
            out.append(f"{data.get('host')}: {data.get('task')}: {msg}")
        return out

    def summary(self) -> str:
        failed = "".join(f"--- failed: {x}\n" for x in self.failures())
        return f"status={self.status} rc={self.rc} stats={self.stats}\n{failed}--- output tail ---\n{self.stdout[-6000:]}"


def small_local_default(workdir: str | os.PathLike) -> dict:
    """Extra variables for site.yml on the embedded local default (inventory/local) at a test's size: the
    end-to-end runs of tests/ansible/test_site_local.py and the check-mode run of every phase in
    tests/reliability/test_check_mode.py use the same ones."""
    # a smaller demo than `make run` (same code path), to keep the suite fast on 2 cores: 20 conversations
    # (~60 rows: extract and prepare scale with the rows; 60 conversations cost 99 s of extraction), 512-token
    # training batches instead of the local default's 2048 (a CPU step costs ~4x less; rows are <= 512 tokens,
    # prepare_max_length, so every row still fits a batch), 6 steps. The demo target trains 30 steps instead of
    # 120 (its 120 steps were ~120 passes over these 20 conversations' ~2000 tokens, ~40 s of CPU; 30 are ~30
    # passes). What is asserted does not depend on the size.
    return {
        "eagle3ops_workdir": str(workdir),
        "prepare_demo_conversations": 20,
        "prepare_demo_train_steps": 30,
        "train_epochs": 1,
        "train_max_steps": 6,
        "train_total_seq_len": 512,
        # the detached extraction is polled every extract_poll_interval (30 s by default): up to 30 s idle
        "extract_poll_interval": 2,
        "train_poll_interval": 2,
    }


def run_playbook(
    playbook: str | os.PathLike,
    inventory: str | os.PathLike,
    *,
    extravars: dict | None = None,
    tags: str | None = None,
    skip_tags: str | None = None,
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    extra_args: str = "",
    envvars: dict | None = None,
    timeout: int = 900,
    private_data_dir: str | os.PathLike | None = None,
    on_event=None,
) -> PlaybookResult:
    """Run ``playbook`` (relative to the repository root, or absolute) against ``inventory``. ``on_event``: called
    with each event while the playbook runs (ansible-runner's event dict), e.g. to act once a task has ended
    instead of after a fixed sleep."""
    import ansible_runner

    pb = Path(playbook)
    if not pb.is_absolute():
        pb = REPO / pb
    pdd = Path(private_data_dir or tempfile.mkdtemp(prefix="e3t-runner-"))
    pdd.mkdir(parents=True, exist_ok=True)
    cmdline = " ".join(x for x in ("--check" if check else "", "--diff" if diff else "", extra_args) if x)
    env = {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        # ansible-runner puts its own callback directory in this variable, which overrides ansible.cfg's
        # callback_plugins: name the project's too (callback_plugins/eagle3ops_progress.py)
        "ANSIBLE_CALLBACK_PLUGINS": str(REPO / "callback_plugins"),
        # The ansible-playbook of the interpreter running the tests (the repo's venv).
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **(envvars or {}),
    }
    # ansible-runner sets SIGTERM and SIGINT handlers that only record the signal, and leaves them set: a process
    # this test worker forks later (prepare's rendering pool) inherited one, ignored the pool's SIGTERM, and CI
    # waited 900 s in pool.join. The worker's own handlers come back after each run.
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        r = ansible_runner.run(
            private_data_dir=str(pdd),
            project_dir=str(REPO),
            playbook=str(pb),
            inventory=str(Path(inventory).resolve()),
            extravars=extravars or {},
            tags=tags,
            skip_tags=skip_tags,
            limit=limit,
            cmdline=cmdline or None,
            envvars=env,
            quiet=True,
            timeout=timeout,
            **({"event_handler": lambda ev: on_event(ev) or True} if on_event else {}),
        )
    finally:
        for s, h in kept.items():
            signal.signal(s, h)
    raw = r.stats or {}
    hosts = set()
    for v in raw.values():
        if isinstance(v, dict):
            hosts.update(v)
    stats = {h: {new: int((raw.get(old) or {}).get(h, 0)) for old, new in _STAT_KEYS.items()} for h in hosts}
    stdout = r.stdout.read() if r.stdout else ""
    return PlaybookResult(rc=r.rc, status=r.status, stats=stats, stdout=stdout, events=list(r.events))

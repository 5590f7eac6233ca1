"""Shared pytest fixtures and options (keep additions additive: other suites rely on these).

Test hosts (systemd-nspawn, see tests/hosts/README.md):

* ``make_host(binds=..., groups=..., host_vars=...)`` -> a booted :class:`hosts.nspawn.NspawnHost`,
  destroyed when the test ends (pass or fail). ``nspawn_host`` is one such host.
* ``session_host_factory`` -> the same factory for hosts shared by a whole session (``.create(...)``).
* ``make_loop_device(size="1G")`` -> :class:`hosts.nspawn.LoopDevice` (``.device`` is ``/dev/loopN``),
  detached after the test; bind it into a host with ``make_host(binds={loop.device: "/dev/vdb"})``.
* ``run_playbook(playbook, inventory, check=..., extravars=..., tags=...)`` -> per-host ansible-runner stats.

Every fixture that needs root/nspawn skips with the reason when this machine cannot run hosts.

Parallel runs (``make test`` = ``pytest tests -n $(TEST_WORKERS)``, pytest-xdist; docs/conventions.md "Test
time budget"): the tests that share a module-scoped fixture run together on one worker (built once), the
modules of a directory in ``SHARED_GROUPS`` run together (shared session fixtures), every other test may
run on any worker, and an ``xdist_group("name")`` mark keeps tests together; the heaviest groups start
first (marks ``qemu`` > ``slow`` > ``nspawn``). Session fixtures are built once per worker: keep them cheap,
build them once per run for every worker with ``tests/run_cache.py``, or cache what they make across runs under
``hosts.nspawn.CACHE_DIR``. Reusable session fixtures: ``nspawn_ready``
(cached rootfs + ssh key), ``session_host_factory``; tests/unit: ``tiny_target``; tests/reliability:
``zygote``, ``tiny_model``, ``prepared``, ``reference``, ``figures``, ``demo``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
if str(_TESTS) not in sys.path:  # `hosts` (the harness package) importable from every test directory
    sys.path.insert(0, str(_TESTS))

# The venv's ansible-* tools (testinfra's ansible backend calls ansible-inventory by name), as `make test` does.
_BIN = str(Path(sys.executable).parent)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")

from hosts import nspawn
from hosts.runner import run_playbook as _run_playbook

# --------------------------------------------------------------------------------------------------
# Parallel runs: `make test` runs `pytest -n $(TEST_WORKERS)` (pytest-xdist); docs/conventions.md
# "Test time budget". Work is handed out by GROUP; a group runs whole on one worker, in its own order:
# * a test with an ``xdist_group("name")`` mark: that group;
# * a test in a directory named in SHARED_GROUPS: that directory's group (its modules share costly session
#   fixtures, built once that way);
# * a test that uses a module-, class- or package-scoped fixture: its module (the fixture is built once);
# * any other test: a group of its own (it may run on any worker, beside its module's other tests).
# Heaviest groups start first (qemu > slow > nspawn > the rest, summed per group): mark tests honestly.
# The workers decide the groups (they collect; the controller only sees node ids) and hand them to the
# controller's scheduler in a file: xdist 3.8's own ``loadgroup`` rewrites a node id that pytest 9 no
# longer reads, so it would ignore the marks.
# --------------------------------------------------------------------------------------------------
SHARED_GROUPS = {"reliability": "tests/reliability"}  # directory under tests/ -> group name
_WEIGHT = (("qemu", 600), ("slow", 60), ("nspawn", 20))  # start order only; unmarked tests weigh 1
_SHARED_SCOPES = ("module", "class", "package")


def group_of(item) -> str:
    """The group of a collected test (see above)."""
    for mark in item.iter_markers("xdist_group"):
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    path = item.nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in SHARED_GROUPS:
        return SHARED_GROUPS[parts[1]]
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}) or {}
    if any(fd.scope in _SHARED_SCOPES for fds in defs.values() for fd in fds):
        return path
    return item.nodeid


def _weight(item) -> int:
    for name, w in _WEIGHT:
        if item.get_closest_marker(name):
            return w
    return 1


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """`-n N` means grouped distribution here (plain `load` would split a module's tests that share a
    module-scoped fixture across workers and build it once per worker)."""
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") in (
        "no",
        "load",
    ):
        config.option.dist = "loadgroup"


def _groups_file(config) -> Path:
    if not hasattr(config, "_e3t_groups"):
        import tempfile

        config._e3t_groups = Path(tempfile.mkdtemp(prefix="e3t-groups-")) / "groups.json"
    return config._e3t_groups


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["e3t_groups"] = str(_groups_file(node.config))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """In an xdist worker: decide each test's group, order the groups heaviest first (a group's own order is
    kept; every worker sorts the same collection the same way, the order the controller hands groups out
    in), and write {node id: group} for the controller."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput:
        return
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(group_of(item), []).append(item)
    order = sorted(groups.values(), key=lambda its: -sum(_weight(i) for i in its))  # stable sort
    items[:] = [i for its in order for i in its]
    out = workerinput.get("e3t_groups")
    if out:
        import json

        tmp = Path(f"{out}.{workerinput.get('workerid', 'w')}.tmp")
        tmp.write_text(json.dumps({i.nodeid: g for g, its in groups.items() for i in its}))
        os.replace(tmp, f"{out}.{workerinput.get('workerid', 'w')}")


def pytest_unconfigure(config):
    groups = getattr(config, "_e3t_groups", None)
    if groups is not None:
        import shutil

        shutil.rmtree(groups.parent, ignore_errors=True)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Group scheduling (``--dist loadgroup``, which `-n` implies here) by the workers' :func:`group_of`."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    groups_file = _groups_file(config)

    class GroupScheduling(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            config.option.loadscopereorder = False  # keep the heaviest-first order of the collection
            self._initial = False
            self._groups: dict[str, str] | None = None

        def _split_scope(self, nodeid):
            if self._groups is None:  # first called once every worker has collected (and written its file)
                import json

                found = sorted(groups_file.parent.glob(groups_file.name + ".*[!p]"))
                self._groups = json.loads(found[0].read_text()) if found else {}
            # without a file (a worker that could not write it): by module, the safe grouping
            return self._groups.get(nodeid) or nodeid.split("::", 1)[0]

        def schedule(self):
            self._initial = self.collection is None
            try:
                super().schedule()
            finally:
                self._initial = False

        def _assign_work_unit(self, node):
            # A worker only starts its last queued test once it has a next one (or is told to stop), so a
            # worker whose first group is a single long test (QEMU) must queue a second group at once:
            # give it the lightest one, not the next heavy one.
            if self._initial and self.assigned_work.get(node) and len(self.workqueue) > 1:
                self.workqueue.move_to_end(next(reversed(self.workqueue)), last=False)
            super()._assign_work_unit(node)

        def remove_node(self, node):
            # A crashed worker (a test that hung past its limit, tests/conftest.py _hard_stop_after): the rest of
            # its group runs on another worker, the test it crashed in does not run again (xdist's loadscope
            # would queue it with the rest, and a test that hangs would take down worker after worker).
            workload = self.assigned_work.get(node, {})
            crashed = next(
                (nid for unit in workload.values() for nid, done in unit.items() if not done), None
            )
            if crashed is None:
                return super().remove_node(node)
            for unit in workload.values():
                if crashed in unit:
                    unit[crashed] = True
            if self._pending_of(workload):
                super().remove_node(node)  # re-queues the rest of the group
            else:
                self.assigned_work.pop(node)
            return crashed

        def _reschedule(self, node):
            # queue the next group when the worker is on its last test (xdist's default waits for <= 2, which
            # leaves a group stuck behind two long tests while other workers may be idle). A worker holds its
            # last queued test until it has a next one or is told to stop: a new worker (one replacing a crashed
            # one) given a one-test group gets a second group, or the stop, in the same call; else it would wait
            # for ever.
            if node.shutting_down:
                return
            while self.workqueue and self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)
            if not self.workqueue:
                node.shutdown()

    return GroupScheduling(config, log)


def _original_stderr(config) -> int:
    """The file descriptor of the terminal's stderr behind pytest's capture (2 when it cannot be found)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    err = getattr(getattr(capman, "_global_capturing", None), "err", None)
    return getattr(err, "targetfd_save", 2)


def _hard_stop_after(item):
    """A timer that ends this process if ``item`` runs 120 s past its pytest-timeout limit: the SIGALRM of
    pytest-timeout's "signal" method reaches only a main thread that runs Python; a test stuck elsewhere would
    hold the whole suite until CI's own limit. Under xdist the controller then reports the worker crashed in
    that test and starts another. Not in a serial run (that would end pytest itself). ``E3T_HARD_STOP_GRACE``
    sets the 120 s."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    mark = item.get_closest_marker("timeout")
    try:  # no "timeout" ini key without pytest-timeout (ValueError)
        limit = float(mark.args[0] if mark and mark.args else item.config.getini("timeout"))
    except (TypeError, ValueError):
        return None
    if limit <= 0:
        return None
    import threading

    grace = float(os.environ.get("E3T_HARD_STOP_GRACE", "120"))

    def stop():
        msg = f"\n[{os.environ['PYTEST_XDIST_WORKER']}] {item.nodeid}: still running {limit + grace:.0f} s after its start, past its timeout; ending this worker (PID {os.getpid()})\n"
        with contextlib.suppress(OSError):
            os.write(_original_stderr(item.config), msg.encode())
        os._exit(3)

    t = threading.Timer(limit + grace, stop)
    t.daemon = True
    t.start()
    return t


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    watchdog = _hard_stop_after(item)
    try:
        yield
    finally:
        if watchdog is not None:
            watchdog.cancel()


_KEPT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)


def _signal_state() -> tuple[dict, frozenset]:
    return {s: signal.getsignal(s) for s in _KEPT_SIGNALS}, frozenset(
        signal.pthread_sigmask(signal.SIG_BLOCK, ())
    )


@pytest.fixture(autouse=True)
def _signals_left_as_found():
    """A test ends with the test worker's signal handlers and mask as it found them. Every process the worker
    forks afterwards inherits both: a handler that only records SIGTERM, left by ansible-runner, made a later
    test's pool workers ignore their SIGTERM, and CI waited 900 s (tests/hosts/runner.py now restores them).
    A test that leaves one changed fails here, naming it; the worker's state is put back first."""
    handlers, mask = _signal_state()
    yield
    now_handlers, now_mask = _signal_state()
    changed = [s for s in _KEPT_SIGNALS if now_handlers[s] != handlers[s]]
    for s in changed:
        signal.signal(s, handlers[s])
    names = [s.name for s in changed]
    if now_mask != mask:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        names.append(f"the signal mask ({sorted(s.name for s in now_mask)})")
    if names:
        pytest.fail(
            f"this test left changed: {', '.join(names)} (restored now); restore them where it sets them"
        )


def pytest_addoption(parser):
    group = parser.getgroup("eagle3ops-hosts", "eagle3ops test hosts (systemd-nspawn)")
    group.addoption(
        "--keep-failed-hosts",
        action="store_true",
        default=False,
        help="leave the nspawn hosts of a failed test running for debugging (ssh -F <workdir>/ssh_config NAME)",
    )


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def _failed(request) -> bool:
    node = request.node
    return any(getattr(getattr(node, f"rep_{w}", None), "failed", False) for w in ("setup", "call"))


@pytest.fixture(scope="session")
def nspawn_ready(tmp_path_factory):
    """(rootfs, ssh key) once per session; skips when test hosts cannot run on this machine."""
    reason = nspawn.unavailable_reason()
    if reason:
        pytest.skip(f"nspawn test hosts unavailable: {reason}")
    rootfs = nspawn.ensure_rootfs(log=lambda m: print(m, file=sys.stderr))
    key = nspawn.make_ssh_key(tmp_path_factory.mktemp("e3t-ssh"))
    return rootfs, key


def _hosts_base(tmp_path_factory) -> Path:
    # Overlay upper/work dirs must not live on an overlay or tmpfs-limited /tmp: use /var/tmp.
    base = Path(os.environ.get("E3T_HOSTS_DIR", "/var/tmp/eagle3ops-tests")) / f"s{os.getpid()}"
    base.mkdir(parents=True, exist_ok=True)
    return base


def pytest_sessionfinish(session, exitstatus):
    """Remove this session's empty host directories (kept hosts of failed tests stay)."""
    base = Path(os.environ.get("E3T_HOSTS_DIR", "/var/tmp/eagle3ops-tests")) / f"s{os.getpid()}"
    if base.is_dir():
        empty = []
        for root, dirs, _files in os.walk(base):
            # never descend into a kept host (its merged root is a live overlay mount)
            dirs[:] = [
                d for d in dirs if not (Path(root, d, ".e3t-host").exists() or os.path.ismount(Path(root, d)))
            ]
            empty.extend(Path(root, d) for d in dirs)
        for d in sorted(empty, key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()


@pytest.fixture(scope="session")
def session_host_factory(nspawn_ready, tmp_path_factory):
    rootfs, key = nspawn_ready
    f = nspawn.HostFactory(_hosts_base(tmp_path_factory) / "session", key, rootfs)
    yield f
    f.cleanup()


@pytest.fixture
def make_loop_device(nspawn_ready, tmp_path_factory, request):
    """Factory: ``make_loop_device(size="1G")`` -> LoopDevice with ``.device`` = /dev/loopN (detached after)."""
    f = nspawn.HostFactory(_hosts_base(tmp_path_factory) / "loops", None, None)
    yield f.loop_device
    f.cleanup()


@pytest.fixture
def make_host(nspawn_ready, make_loop_device, tmp_path_factory, request):
    """Factory: ``make_host(binds=None, groups=("testhosts",), host_vars=None, start=True)``."""
    rootfs, key = nspawn_ready
    f = nspawn.HostFactory(
        _hosts_base(tmp_path_factory) / request.node.name[:40].replace("/", "_"), key, rootfs
    )
    yield f.create
    if _failed(request) and request.config.getoption("--keep-failed-hosts"):
        for h in f.hosts:
            print(
                f"\nkept {h.name} ({h.ip}): ssh -F {h.ssh_config} {h.name}; nspawn pid {h.pid}",
                file=sys.stderr,
            )
        return
    f.cleanup()


@pytest.fixture
def nspawn_host(make_host):
    """One freshly booted Debian bookworm host (real systemd), destroyed after the test."""
    return make_host()


@pytest.fixture
def run_playbook(tmp_path):
    """``run_playbook(playbook, inventory, **kw)`` -> tests.hosts.runner.PlaybookResult (artifacts in tmp_path)."""
    counter = iter(range(1000))

    def run(playbook, inventory, **kw):
        kw.setdefault("private_data_dir", tmp_path / f"runner{next(counter)}")
        return _run_playbook(playbook, inventory, **kw)

    return run

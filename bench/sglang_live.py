"""The live SGLang harness's shared parts (bench/sglang_live_lanes.py runs the live run; bench/sglang_live_smol.py,
sglang_live_smol_serve.py, sglang_live_demo.py, proof_of_value.py and pov_measure.py build on it): the run's state
(work directory ``W``, ``SUMMARY``, the ``DEADLINE``, ``DEMO_QUIET``, the server command), stages bounded by the
budget, results saved per stage, the eagle3ops CLI, HTTP, measuring servers, the playbooks' runs and their output
read back. It imports none of the scripts built on it (``tests/unit/core/test_bench_imports.py``).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

# the run's state, which every lane and the scripts built on this harness read and set here (``L.W = ...``)
ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
T0 = time.time()
DEADLINE = [T0 + 1e9]
W = Path("/tmp/live")
SUMMARY: dict = {}
_LOCK = threading.Lock()
SERVER_CMD = shlex.split(os.environ.get("LIVE_SERVER_CMD", "")) or [PY, "-m", "sglang.launch_server"]
# set when lane demo no longer uses the GPU: lane smol's measurements wait for it (bounded), so its tok/s
# figures are not taken while the other lane serves or trains
DEMO_QUIET = threading.Event()

BOX_FLAGS = [  # what the trimmed kernels of the box's wheelhouse need (../shared/notes/gpu-box-sglang.md)
    "--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none",
]  # fmt: skip


def log(msg: str) -> None:
    print(f"[live {time.strftime('%H:%M:%S')} +{time.time() - T0:5.0f}s] {msg}", flush=True)


def left() -> float:
    return DEADLINE[0] - time.time()


def save(stage: str, obj) -> None:
    """One stage's result, and the summary of all so far (replaced whole: a poll may copy it at any moment)."""
    from eagle3ops.durable import atomic_write_text

    (W / "res").mkdir(parents=True, exist_ok=True)
    (W / "res" / f"{stage}.json").write_text(json.dumps(obj, indent=1, default=str))
    with _LOCK:
        SUMMARY[stage] = obj
        atomic_write_text(W / "summary.json", json.dumps(SUMMARY, indent=1, default=str), fsync=False)


def stage(name: str, need_s: float = 30):
    """Decorator: run only when need_s fits before the deadline; record errors, never raise."""

    def deco(fn):
        def wrapped(*a, **k):
            if left() < need_s:
                log(f"{name}: skipped ({left():.0f} s left, needs ~{need_s:.0f})")
                save(name, {"skipped": f"{left():.0f} s left"})
                return None
            log(f"{name}: start")
            t = time.time()
            try:
                out = fn(*a, **k)
            except Exception as e:  # a bench stage reports, the next one runs
                log(f"{name}: FAILED {type(e).__name__}: {e}")
                save(name, {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]})
                return None
            log(f"{name}: done in {time.time() - t:.1f} s")
            if isinstance(out, dict):
                out.setdefault("stage_s", round(time.time() - t, 1))
                save(name, out)
            return out

        return wrapped

    return deco


def cli(*args: str, timeout: float = 3600, name: str | None = None, env: dict | None = None) -> dict:
    """eagle3ops ARGS --json -> its JSON (rc and the stderr tail added); the log kept under WORK/logs."""
    (W / "logs").mkdir(parents=True, exist_ok=True)
    t = time.time()
    try:
        r = subprocess.run(
            [PY, "-m", "eagle3ops", *args, "--json"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as e:
        log(f"eagle3ops {args[0]}: no answer within {timeout:.0f} s (killed)")
        return {"rc": None, "timed_out_s": timeout, "stderr_tail": str(e.stderr or "")[-2000:]}
    (W / "logs" / f"{name or args[0]}.log").write_text(r.stdout + "\n--- stderr\n" + r.stderr)
    res: dict = {}
    for line in reversed(r.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                res = json.loads(line)
            except json.JSONDecodeError:
                continue
            break
    res["rc"] = r.returncode
    res["wall_s"] = round(time.time() - t, 1)
    if r.returncode:
        res["stderr_tail"] = r.stderr[-2000:]
        log(f"eagle3ops {args[0]} rc={r.returncode}: {res.get('msg') or r.stderr[-500:]}")
    return res


def http(url: str, body: dict | None = None, timeout: float = 300) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


class Server:
    """One SGLang server process (plain or EAGLE3), its log under WORK/logs/NAME.log.

    ``mem``: --mem-fraction-static, a share of the memory free at its start (0.5.17); ``max_tokens`` caps the KV
    pool, so the server takes little of the GPU whatever ``mem`` says. ``graph_bs``: the largest batch captured
    in a CUDA graph (fewer graphs, faster start; the measurements use batch 1 and a small concurrency)."""

    def __init__(self, name, model, port, draft=None, spec=(3, 1, 4), extra=(), cuda_graph=True, mem=0.5,
                 max_tokens=262144, graph_bs=None):  # fmt: skip
        self.name, self.port, self.url = name, port, f"http://127.0.0.1:{port}"
        self.cuda_graph, self.spec, self.draft = cuda_graph, spec, draft
        self.args = (name, model, port)
        self.kw = {"draft": draft, "spec": spec, "extra": extra, "mem": mem, "max_tokens": max_tokens,
                   "graph_bs": graph_bs}  # fmt: skip
        self.argv = [*SERVER_CMD, "--model-path", str(model), "--port", str(port), "--host", "127.0.0.1",
                     "--dtype", "bfloat16", "--mem-fraction-static", str(mem), "--max-total-tokens",
                     str(max_tokens), "--log-level", "info", *BOX_FLAGS, *extra]  # fmt: skip
        if not cuda_graph:
            self.argv.append("--disable-cuda-graph")
        elif graph_bs:
            self.argv += ["--cuda-graph-max-bs", str(graph_bs)]
        if draft:
            n, k, d = spec
            self.argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
                          "--speculative-num-steps", str(n), "--speculative-eagle-topk", str(k),
                          "--speculative-num-draft-tokens", str(d),
                          "--speculative-draft-attention-backend", "triton"]  # fmt: skip
        self.proc = None
        self.ready_s = None

    def start(self, timeout: float = 300, env: dict | None = None) -> Server:
        (W / "logs").mkdir(parents=True, exist_ok=True)
        logf = open(W / "logs" / f"{self.name}.log", "w")  # noqa: SIM115 - lives as long as the server
        t = time.time()
        self.proc = subprocess.Popen(
            self.argv, stdout=logf, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            start_new_session=True,
        )  # fmt: skip
        while time.time() - t < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: server exited {self.proc.returncode}: {self.tail()}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2).read()
                self.ready_s = round(time.time() - t, 1)
                log(
                    f"{self.name}: healthy after {self.ready_s} s (CUDA graphs {'on' if self.cuda_graph else 'off'})"
                )
                return self
            except (urllib.error.URLError, OSError):
                time.sleep(1)
        self.stop()
        raise RuntimeError(f"{self.name}: no /health after {timeout:.0f} s: {self.tail()}")

    def tail(self, n: int = 15) -> str:
        p = W / "logs" / f"{self.name}.log"
        return " | ".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_server(*a, timeout: float = 300, env: dict | None = None, **k) -> Server:
    """Start with CUDA graphs; fall back to --disable-cuda-graph once if that start fails (the failure is kept in
    WORK/logs/NAME.graphs-failed.log and in the server's ``graph_error``)."""
    s = Server(*a, **k)
    try:
        return s.start(timeout=timeout, env=env)
    except RuntimeError as e:
        if not s.cuda_graph:
            raise
        log(f"{s.name}: start with CUDA graphs failed ({str(e)[-300:]}); retrying with --disable-cuda-graph")
        failed = W / "logs" / f"{s.name}.log"
        if failed.exists():
            failed.replace(W / "logs" / f"{s.name}.graphs-failed.log")
        s2 = Server(*a, **{**k, "cuda_graph": False})
        s2.graph_error = str(e)[-600:]
        return s2.start(timeout=timeout, env=env)


# ------------------------------------------------------------------------------------------ measuring


def measure(url: str, questions: list[str], max_new: int, concurrency: int, render) -> dict:
    """eagle3ops' own load generator (the benchmark phase's): output tok/s and acceptance length."""
    from eagle3ops.benchmark.loadgen import run_load

    r = run_load(
        url, [[q] for q in questions], concurrency=concurrency, max_new_tokens=max_new, render=render
    )
    # acceptance_per_request stays: completion tokens / spec_verify_ct of each request
    r.pop("per_turn", None)
    return r


def measure_pair(url: str, qs: list[str], a, render, tokens: int) -> dict:
    """batch 1 and ``a.bench_concurrency`` on one server: the measurement every serving stage reports."""
    return {
        "batch1": measure(url, qs, tokens, 1, render),
        f"conc{a.bench_concurrency}": measure(url, qs, tokens, a.bench_concurrency, render),
    }


def norm(s: str) -> str:
    return " ".join(s.lower().split())


def eagle3ops_wrapper() -> Path:
    """/tmp/e3bin/eagle3ops: ``python -m eagle3ops`` with this checkout first on the path (the roles' executable)."""
    d = Path(os.environ.get("LIVE_E3BIN", "/tmp/e3bin"))
    d.mkdir(parents=True, exist_ok=True)
    w = d / "eagle3ops"
    w.write_text(f'#!/bin/sh\nexec "{PY}" -m eagle3ops "$@"\n')
    w.chmod(0o755)
    return w


def ansible_playbook() -> list[str] | None:
    """How to run ansible-playbook here: next to this interpreter, in /tmp/sglsite/bin (pip --target), on PATH."""
    for c in (Path(PY).parent / "ansible-playbook", Path("/tmp/sglsite/bin/ansible-playbook")):
        if c.exists():
            return [PY, str(c)]
    w = shutil.which("ansible-playbook")
    return [w] if w else None


_TASK = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(?P<task>.*)\] \**$")
_RESULT = re.compile(
    r"^(?P<status>ok|changed|fatal|failed|skipping): \[(?P<host>[^\]]+)\](?:: FAILED!)?"
    r"(?: => \(item=.*?\))?(?: => (?P<json>\{.*\}))?$"
)
_RECAP = re.compile(
    r"^(?P<host>\S+)\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)\s+"
    r"failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)\s+rescued=(?P<rescued>\d+)\s+ignored=(?P<ignored>\d+)"
)


def parse_playbook_output(out: str) -> dict:
    """What ansible-playbook -v printed with the default callback, results as one-line JSON
    (``ANSIBLE_CALLBACK_RESULT_FORMAT=json``, ``ANSIBLE_CALLBACK_FORMAT_PRETTY=false``): ``tasks``, every result in
    order as {task ("role : name"), host, status (ok, changed, fatal, failed, skipping), result (the JSON, or None
    where a line carries none)}; ``stats``, the recap counts per host (the last recap: one per run)."""
    tasks: list[dict] = []
    stats: dict = {}
    task = None
    for line in out.splitlines():
        m = _TASK.match(line)
        if m:
            task = m["task"]
            continue
        m = _RESULT.match(line)
        if m and task is not None:
            try:
                result = json.loads(m["json"]) if m["json"] else None
            except ValueError:
                result = None
            tasks.append({"task": task, "host": m["host"], "status": m["status"], "result": result})
            continue
        m = _RECAP.match(line.strip())
        if m:
            stats[m["host"]] = {k: int(v) for k, v in m.groupdict().items() if k != "host"}
    return {"tasks": tasks, "stats": stats}


def task_result(parsed: dict, task: str) -> dict | None:
    """The last result of the task whose name ends with ``task`` (role prefix left out), None when it never ran."""
    hits = [t for t in parsed["tasks"] if t["task"].split(" : ", 1)[-1] == task and t["status"] != "skipping"]
    if not hits:
        return None
    return {"status": hits[-1]["status"], **(hits[-1]["result"] or {})}


def playbook_env(d: Path) -> dict:
    """ansible-playbook's environment: the repo's ansible.cfg, its temp and home under ``d``, and results printed as
    one-line JSON (what :func:`parse_playbook_output` reads at -v)."""
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8",
            "ANSIBLE_LOCAL_TEMP": str(d / "tmp"), "ANSIBLE_HOME": str(d / "ansible-home"), "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_CALLBACK_FORMAT_PRETTY": "false"}  # fmt: skip


def run_playbooks(name: str, extravars: dict, timeout: float, playbooks=("serve.yml", "benchmark.yml"),
                  keep: tuple[str, ...] = ()) -> dict:  # fmt: skip
    """``playbooks`` (default playbooks/serve.yml + playbooks/benchmark.yml) in one ansible-playbook run on
    inventory/gpu-box (connection local), with the run's own paths as extra variables. Returns the recap (line and
    counts per host), the changed tasks, the results of the tasks named in ``keep``, the benchmark's report files
    where it wrote them, and the log tail on failure; every task's result is kept in WORK/pb-NAME/tasks.json."""
    apb = ansible_playbook()
    if not apb:
        return {"error": "no ansible-playbook (carry ansible-core)"}
    d = W / f"pb-{name}"
    d.mkdir(parents=True, exist_ok=True)
    ev = {
        "eagle3ops_workdir": str(d / "work"),
        "runtime_eagle3ops_bin": str(eagle3ops_wrapper()),
        **extravars,
    }
    (d / "vars.json").write_text(json.dumps(ev, indent=1))
    argv = [*apb, "-v", "-i", str(ROOT / "inventory" / "gpu-box"), "-e", f"@{d / 'vars.json'}",
            *(str(ROOT / "playbooks" / p) for p in playbooks)]  # fmt: skip
    t = time.time()
    try:
        r = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=playbook_env(d), cwd=str(ROOT)
        )
        out, rc = r.stdout + "\n--- stderr\n" + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = f"{e.stdout or ''}\n--- timed out after {timeout:.0f} s\n{e.stderr or ''}", None
    out = out if isinstance(out, str) else str(out)
    (W / "logs").mkdir(parents=True, exist_ok=True)
    (W / "logs" / f"playbook-{name}.log").write_text(out)
    parsed = parse_playbook_output(out)
    (d / "tasks.json").write_text(json.dumps(parsed, indent=1, default=str))
    res: dict = {"rc": rc, "wall_s": round(time.time() - t, 1), "argv": " ".join(argv)}
    recap = [ln for ln in out.splitlines() if _RECAP.match(ln.strip())]
    res["recap"] = recap[-1].strip() if recap else None
    res["stats"] = parsed["stats"]
    res["changed_tasks"] = [x["task"] for x in parsed["tasks"] if x["status"] == "changed"]
    for task in keep:
        res[task] = task_result(parsed, task)
    bdir = d / "work" / "benchmark"
    for f in ("report.json", "live_with_draft.json", "live_without_draft.json", "acceptance.json"):
        if (bdir / f).exists():
            try:
                res[f] = json.loads((bdir / f).read_text())
            except ValueError as e:
                res[f] = f"unreadable: {e}"
    if rc != 0:
        res["log_tail"] = out[-4000:]
    return res


# --------------------------------------------------------------------------------------------- lane smol


def sharegpt_rows(assets: str) -> list[str]:
    """The carried ShareGPT conversations, one JSON object a line: ``sharegpt.jsonl.xz`` (bench/sglang_live_carry.sh
    since 2026-12-02: up to 16,000, continuation chunks included) or the older ``sharegpt_12k.jsonl.gz``."""
    import lzma

    xz = Path(assets) / "sharegpt.jsonl.xz"
    opener, path = (lzma.open, xz) if xz.exists() else (gzip.open, Path(assets) / "sharegpt_12k.jsonl.gz")
    with opener(path, "rt", encoding="utf-8") as f:
        return [x for x in f if x.strip()]


def serve_configs(spec: str) -> list[tuple[str, tuple[int, int, int]]]:
    """``--serve-configs``: ``KEY:S-K-D,...`` (KEY: regen, orig, wrong, broken) -> [(key, (steps, topk, draft))];
    parsed in main(), before any lane starts, so a typo ends the run at once and not after the training."""
    out = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        key, _, sp = item.partition(":")
        steps = tuple(int(v) for v in sp.split("-"))
        if key not in ("regen", "orig", "wrong", "broken") or len(steps) != 3:
            raise SystemExit(
                f"--serve-configs: {item!r} is not KEY:STEPS-TOPK-DRAFT (KEY regen, orig, wrong, broken)"
            )
        out.append((key, steps))
    return out


def stop_playbook_servers(name: str) -> dict:
    """Stop the servers playbook run ``name`` left running (the serve phase keeps its server up, by design): the
    smoke run does, so a shared CPU machine is not left with stand-ins holding the ports. Through the serve phase's
    own launcher (``eagle3ops serve-process stop``), one per PID file in its run directory."""
    run = W / f"pb-{name}" / "work" / "serve" / "run"
    return {
        f.stem: cli(
            "serve-process", "stop", "--run-dir", str(run), "--name", f.stem, name=f"stop_{name}_{f.stem}"
        )
        for f in sorted(run.glob("*.pid"))
    }


def demo_capture_over(timeout: float) -> dict:
    """Lane demo patches the SGLang install both lanes share while it captures, and the serve phase refuses a patched
    file: wait (bounded) until lane demo has restored it (its result.json has ``patch_status_after``) or ended."""
    res, t = W / "demo" / "result.json", time.time()
    while not DEMO_QUIET.is_set() and time.time() - t < timeout:
        try:
            if "patch_status_after" in json.loads(res.read_text()):
                break
        except (OSError, ValueError):  # not written yet, or caught mid-write
            pass
        time.sleep(2)
    return {"s": round(time.time() - t, 1), "demo_ended": DEMO_QUIET.is_set()}


if __name__ == "__main__":
    sys.exit("the live run is bench/sglang_live_lanes.py; this module holds its shared parts")

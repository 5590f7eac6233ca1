"""Lane ``demo`` of bench/sglang_live_lanes.py (issue #17): the SGLang extraction backend against a real server.

On the box, with SGLang installed under /tmp/sglsite (bench/sglang_live.sh): the demo target
(``eagle3ops demo``: a tiny DeepSeek-V3, MLA + MoE, SGLang's config fields, bf16) is prepared once and copied
to two data directories; one is extracted by the transformers backend on CUDA, the other through the real
server, by the phases themselves (``--capture-via playbooks``, the default; ``inventory/gpu-box``):
``playbooks/sglang.yml`` applies the capture patch to the installed ``deepseek_v2.py`` (``sglang_site_packages``:
nothing is installed), the harness launches the server with the capture flags and the hook's environment (no
systemd there for the role's unit), ``playbooks/extract.yml`` (``extract_backend: sglang``,
``extract_sglang_server_unit: ""``) attaches to it, sends every row and restores the patch byte-exact; after the
server stopped both playbooks run once more and must change nothing (``playbook_rerun.changed_zero``); the file's
sha256 must equal the one before (``restored_byte_exact``). ``--capture-via cli`` does the same through
``eagle3ops sglang-patch apply/restore`` and ``eagle3ops extract-sglang`` (the runs up to 2026-12-02). Then both
stores are compared file by file (token ids equal; states within the stated bf16 tolerance) and the capture
overhead is measured on the same server: the same rows once more as plain prefills (request ids the hook ignores,
``max_new_tokens=1``) against the captured run's tok/s.
Last, a demo draft is trained on the transformers store (speculators, on the GPU) and the serve and benchmark
phases run as playbooks (``playbooks/serve.yml`` + ``playbooks/benchmark.yml``, ``inventory/gpu-box``) against
the real server: the capture patch must be pristine again, the draft is converted and served by the role's own
launcher, the guard probes it, the benchmark measures it with and without the draft and writes the report.

CPU smoke run (``bench/sglang_live_lanes.py --smoke``, ``--device cpu``): the same steps and playbooks on the real 0.5.17
``deepseek_v2.py`` (patched and restored for real), with the capture server stood in by
tests/fixtures/sglang_standin_server.py, which runs the REAL hook and store over the transformers forward. Not
exercised there: SGLang loading the patched 0.5.17 file and calling the hook from its own forward (CUDA only; the
stand-in calls the hook as 0.5.23's patched lines do), and every timing (the capture overhead means nothing on CPU).

Capture overhead on a target whose forward dominates (``--mid``; the goal's setting): the demo rows are tiny and
the demo target computes them in microseconds, so there the per-row costs are all that is measured. A
DeepSeek-V3-shaped random target of realistic width (bench/capture_target.py: hidden 2048, 40 layers, MLA + MoE,
~3.9B parameters) is built on the GPU meanwhile, with the converted SmolLM2's tokenizer (lane smol writes it), and
ShareGPT conversations are prepared for it (rows of real length). Its capture server starts while the patch that
``playbooks/sglang.yml`` applied is in place (the server keeps the patched module it loaded; the demo's extraction
waits for it, then restores the file); it writes its store under ``--mid-dir`` (``/dev/shm`` where it has room: the
box's disk is the other lane's). When lane smol leaves the GPU to the CPU (its ``prepare``: it touches
``--gpu-window``), the same rows go through the server as a warm-up of plain prefills, then captured
(``eagle3ops extract-sglang``: the request loop's tok/s), then as plain prefills again, all at one concurrency: the
ratio captured / plain is the overhead figure. ``--mid-done`` is touched after (lane smol's extraction waits for it,
bounded).

Result: WORK/result.json (read by sglang_live_lanes.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_live as L  # the harness pieces (cli, Server, http)

SGLANG_VERSION = os.environ.get("LIVE_SGLANG_VERSION", "0.5.17")


def compare(tf_dir: Path, sg_dir: Path, limit: int | None = None) -> dict:
    """Per file: token ids equal; per (token, state) ||a-b|| / ||a|| (relative L2 error) and max |a-b|."""
    import torch
    from safetensors.torch import load_file

    files = sorted((tf_dir / "hidden_states").glob("hs_*.safetensors"), key=lambda p: int(p.stem[3:]))[:limit]
    worst_rel, worst_abs, rels, missing, id_mismatch, per_file = 0.0, 0.0, [], 0, 0, []
    for f in files:
        g = sg_dir / "hidden_states" / f.name
        if not g.exists():
            missing += 1
            continue
        a, b = load_file(str(f)), load_file(str(g))
        if not torch.equal(a["token_ids"], b["token_ids"]):
            id_mismatch += 1
            continue
        x, y = a["hidden_states"].float(), b["hidden_states"].float()
        rel = (x - y).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-6)  # [T, K+1]
        rels.append(rel.flatten())
        per_file.append(rel)
        worst_rel = max(worst_rel, rel.max().item())
        worst_abs = max(worst_abs, (x - y).abs().max().item())
    allrel = torch.cat(rels) if rels else torch.zeros(1)
    per_state = torch.stack([r.mean(0) for r in per_file]).mean(0).tolist() if per_file else []
    return {
        # how rare the large errors are (a token whose MoE routing flipped between the two backends)
        "share_rel_l2_over_0.05": round((allrel > 0.05).float().mean().item(), 6),
        "share_rel_l2_over_0.2": round((allrel > 0.2).float().mean().item(), 6),
        "rel_l2_mean_per_state": [round(x, 5) for x in per_state],  # the aux layers, then the last state
        "files_compared": len(rels),
        "missing_in_sglang_store": missing,
        "token_id_mismatches": id_mismatch,
        "rel_l2_max": round(worst_rel, 5),
        "rel_l2_mean": round(allrel.mean().item(), 5),
        "rel_l2_p99": round(allrel.quantile(0.99).item(), 5) if allrel.numel() > 1 else None,
        "abs_max": round(worst_abs, 5),
    }


PATCH_TASK = "SGLang | Capture patch in deepseek_v2.py"
EXTRACT_TASK = "Extract | Collect the result of the extraction through SGLang"  # the async job's result
RESTORE_TASK = "Extract | Restore the capture patch byte-exact (SGLang as shipped; serving needs it)"


def sha256(p: Path) -> str | None:
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None


def capture_server(
    a, model: Path, ids: list[int], name: str = "demo_capture", port: int = 30020, **server_kw
) -> L.Server:
    """The capture server the harness starts (not the roles: the box has no systemd for the sglang phase's unit).
    ``server_kw`` go to :class:`sglang_live.Server` (``--mid``'s larger target takes less memory and fewer graphs).

    On the box: SGLang with the capture flags (docs/sglang.md), loading the patched ``deepseek_v2.py``. In the CPU
    smoke run (``--device cpu``): the STAND-IN of a patched server (tests/fixtures/sglang_standin_server.py, its
    capture mode), which runs the REAL hook over the transformers forward of the same model and writes the real
    store; it calls the hook as 0.5.23's patched lines do, so the 0.5.17 patch's own lines run only on the box."""
    from eagle3ops.sglang.versions import dump_capture_args

    # what the dump needs, plus the version's capture-only flags (none on 0.5.17: the patch turns the capture on)
    capture = ["--disable-radix-cache", "--chunked-prefill-size", "-1", "--disable-prefill-cuda-graph",
               *dump_capture_args(SGLANG_VERSION, ids)]  # fmt: skip
    srv = L.Server(name, model, port, extra=capture, cuda_graph=True, **server_kw)
    if a.device == "cpu":
        srv.argv = [L.PY, str(L.ROOT / "tests" / "fixtures" / "sglang_standin_server.py"), "--model", str(model),
                    "--port", str(port), "--port-file", str(L.W / f"standin-{name}.port"), "--max-batch", "8"]  # fmt: skip
    return srv


def capture_env(data_dir: Path, ids: list[int]) -> dict:
    """The capture hook's environment (what the sglang phase's unit sets): where to write, which layers."""
    from eagle3ops.sglang import hook as sglang_hook

    return {sglang_hook.ENV_DUMP_DIR: str(data_dir), sglang_hook.ENV_LAYER_IDS: ",".join(map(str, ids))}


def capture_playbooks(done, srv: L.Server, env: dict, ev: dict, after_patch=None) -> dict:
    """Issue #17 through the roles: playbooks/sglang.yml applies the capture patch in the pip --target install
    (sglang_site_packages: nothing installed), the harness starts the capture server, playbooks/extract.yml
    (extract_backend sglang) attaches to it (extract_sglang_server_unit "") and restores the patch byte-exact."""
    pb = L.run_playbooks("demo-sglang", ev, timeout=max(60, L.left() - 300), playbooks=("sglang.yml",),
                         keep=(PATCH_TASK,))  # fmt: skip
    done("sglang_playbook", pb)
    done("patch_apply", pb.get(PATCH_TASK) or {"error": "the patch task did not run", "rc": pb.get("rc")})
    if pb.get("rc") != 0:
        raise RuntimeError(f"playbooks/sglang.yml exited {pb.get('rc')}: {pb.get('recap')}")
    # a second capture server (--mid) loads the patched module while it is in place; extract.yml restores it
    waiter = after_patch() if after_patch else None
    srv.start(timeout=240, env=env)
    done("server_ready_s", srv.ready_s)
    if waiter is not None:
        t = time.time()
        waiter.join(timeout=max(0.0, L.left() - 300))
        done("mid_server_wait_s", round(time.time() - t, 1))
    x = L.run_playbooks("demo-extract", ev, timeout=max(60, L.left() - 120), playbooks=("extract.yml",),
                        keep=(EXTRACT_TASK, RESTORE_TASK))  # fmt: skip
    r = x.pop(EXTRACT_TASK, None) or {"error": "the extract task did not run", "rc": x.get("rc")}
    done("patch_restore", x.pop(RESTORE_TASK, None) or {"error": "the restore task did not run"})
    done("extract_playbook", x)
    done("extract_sglang", r)
    return r


def capture_cli(
    done, srv: L.Server, env: dict, sg: Path, model: Path, site: list[str], rows: int | None, after_patch=None
) -> dict:
    """The same through the CLIs (``--capture-via cli``: the path of the runs up to 2026-12-02)."""
    done("patch_apply", L.cli("sglang-patch", "apply", *site, name="patch_apply"))
    waiter = after_patch() if after_patch else None
    srv.start(timeout=240, env=env)
    if waiter is not None:
        waiter.join(timeout=max(0.0, L.left() - 300))
    done("server_ready_s", srv.ready_s)
    r = L.cli("extract-sglang", "--data", str(sg), "--model", str(model), "--url", srv.url, "--concurrency", "32",
              "--sglang-version", SGLANG_VERSION, "--no-progress", "--server-pid", str(srv.proc.pid),
              "--health-timeout", "120", *(["--limit", str(rows)] if rows else []), name="sglang_extract",
              timeout=max(60, L.left() - 120))  # fmt: skip
    done("extract_sglang", r)
    return r


def plain_prefills(srv: L.Server, tf: Path, r: dict, limit: int | None, concurrency: int = 32) -> dict:
    """The same rows again on the same server as plain prefills (request ids the hook ignores, max_new_tokens=1)
    against the captured run's tok/s: the capture's overhead. The server keeps the patched module it loaded. The
    captured rate is the client's request loop (``loop_tokens_per_second``: first request to last confirmed file),
    as the plain one is this loop's; the whole command's rate (setup included) is kept beside it."""
    from datasets import load_from_disk

    rows = load_from_disk(str(tf)).with_format(None)["input_ids"][:limit]
    t = time.time()

    def prefill(i_ids):
        i, ids_ = i_ids
        L.http(srv.url + "/generate", {"input_ids": ids_, "rid": f"plain-{i}-{time.time_ns()}",
                                       "sampling_params": {"max_new_tokens": 1, "temperature": 0}})  # fmt: skip

    with cf.ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(prefill, enumerate(rows)))
    wall = time.time() - t
    toks = sum(len(x) for x in rows)
    cap = r.get("loop_tokens_per_second") or r.get("tokens_per_second") or r.get("tok_s")
    return {"plain_prefill_tok_s": round(toks / wall, 1), "rows": len(rows), "tokens": toks, "captured_tok_s": cap,
            "captured_tok_s_whole_command": r.get("tokens_per_second"), "concurrency": concurrency,
            "row_seconds": r.get("row_seconds"), "ratio": round(cap / (toks / wall), 3) if cap else None}  # fmt: skip


# ------------------------------------------------------------------------------ the realistic-width target (--mid)


def wait_file(p: Path, timeout: float) -> float:
    t = time.time()
    while not p.exists() and time.time() - t < timeout:
        time.sleep(1)
    return round(time.time() - t, 1)


class Mid:
    """The capture-overhead measurement on a target whose forward dominates (module docstring, ``--mid``)."""

    def __init__(self, a, done):
        self.a, self.done = a, done
        self.base = mid_dir(a)
        self.model, self.data = self.base / "model", self.base / "data"
        # on the disk (no room in /dev/shm) the store shares it with lane smol's: ~600 rows (~6 GB), removed after
        self.rows = a.mid_rows or (0 if str(self.base).startswith("/dev/shm") else 600)
        self.srv: L.Server | None = None
        self.ids: list[int] = []
        self.error: str | None = None

    def prepare(self) -> None:
        """Thread 1: the target (on the GPU, seconds) and its rows (ShareGPT, prepared with its tokenizer)."""
        a = self.a
        try:
            tok = Path(a.mid_tokenizer)
            waited = wait_file(tok / "tokenizer.json", a.mid_tokenizer_wait_s)
            if not (tok / "config.json").exists():
                raise RuntimeError(f"no tokenizer at {tok} after {waited} s (lane smol converts it)")
            self.base.mkdir(parents=True, exist_ok=True)
            r = subprocess.run([L.PY, str(L.ROOT / "bench" / "capture_target.py"), "--out", str(self.model),
                                  "--tokenizer-from", str(tok), "--hidden", str(a.mid_hidden), "--layers",
                                  str(a.mid_layers), "--device", a.device], capture_output=True, text=True,
                                 timeout=900)  # fmt: skip
            if r.returncode:
                raise RuntimeError(f"capture_target.py exited {r.returncode}: {r.stderr[-1500:]}")
            built = json.loads(r.stdout.strip().splitlines()[-1])
            rows = L.sharegpt_rows(a.assets)
            conv = self.base / "conversations.jsonl"
            # the end of the file: lane smol trains on its start
            conv.write_text("".join(rows[-a.mid_conversations :]))
            p = L.cli("prepare", "--model", str(self.model), "--input", str(conv), "--out", str(self.data),
                      "--max-length", "2048", "--on-error", "skip", name="mid_prepare")  # fmt: skip
            if p.get("rc"):
                raise RuntimeError(f"prepare exited {p.get('rc')}: {p.get('stderr_tail', '')[-800:]}")
            from eagle3ops import layers

            self.ids = layers.resolve(int(built.get("num_layers") or a.mid_layers), None, "input")
            self.done("mid_target", {"tokenizer_wait_s": waited, "dir": str(self.base), **built,
                                     "prepare": {k: p.get(k) for k in ("num_rows", "num_tokens", "seconds", "rc")},
                                     "layer_ids": self.ids})  # fmt: skip
        except Exception as e:  # recorded; lane demo goes on without it
            self.error = f"{type(e).__name__}: {e}"
            self.done("mid_target", {"error": self.error})
            self.release()

    def release(self) -> None:
        """Lane smol's extraction waits for this file: touched once the measurement is over or cannot happen."""
        if self.a.mid_done:
            Path(self.a.mid_done).touch()

    def start(self, prep: threading.Thread) -> None:
        """Thread 2, started right after the patch was applied: the capture server loads the patched module."""
        prep.join()
        if self.error:
            return
        try:
            srv = capture_server(self.a, self.model, self.ids, "mid_capture", 30021, mem=0.3, max_tokens=131072,
                                 graph_bs=8)  # fmt: skip
            self.srv = srv.start(timeout=360, env=capture_env(self.data, self.ids))
            self.done("mid_server_ready_s", srv.ready_s)
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
            self.done("mid_server", {"error": self.error})
            self.release()

    def measure(self) -> None:
        """Thread 3: in lane smol's GPU window, plain (warm-up) / captured / plain, one concurrency; then stop."""
        a = self.a
        try:
            if self.srv is None:
                return
            waited = wait_file(Path(a.gpu_window), a.gpu_window_wait_s) if a.gpu_window else 0.0
            conc = a.mid_concurrency
            warm = plain_prefills(self.srv, self.data, {}, min(self.rows or 10**9, 256), conc)
            r = L.cli("extract-sglang", "--data", str(self.data), "--model", str(self.model), "--url",
                      self.srv.url, "--concurrency", str(conc), "--sglang-version", SGLANG_VERSION, "--no-progress",
                      "--server-pid", str(self.srv.proc.pid), "--health-timeout", "120",
                      *(["--limit", str(self.rows)] if self.rows else []), name="mid_sglang_extract",
                      timeout=max(60, L.left() - 60))  # fmt: skip
            after = plain_prefills(self.srv, self.data, r, self.rows or None, conc)
            keep = ("written", "failed", "tokens", "bytes", "seconds", "tokens_per_second", "loop_seconds",
                    "loop_tokens_per_second", "row_seconds", "retries", "errors", "rc")  # fmt: skip
            self.done("mid_capture_overhead", {
                "gpu_window_wait_s": waited, "concurrency": conc, "store": str(self.data),
                "warmup_plain_tok_s": warm["plain_prefill_tok_s"], "extract": {k: r.get(k) for k in keep},
                **after,
            })  # fmt: skip
        except Exception as e:
            self.done("mid_capture_overhead", {"error": f"{type(e).__name__}: {e}"})
        finally:
            if self.srv is not None:
                self.srv.stop()
            self.release()
            # /dev/shm is memory; the disk is shared
            shutil.rmtree(self.data / "hidden_states", ignore_errors=True)
            shutil.rmtree(self.model, ignore_errors=True)


def mid_dir(a) -> Path:
    """/dev/shm where it has room for the store (memory, not the disk lane smol fills), else WORK/mid."""
    if a.mid_dir:
        return Path(a.mid_dir)
    try:
        if shutil.disk_usage("/dev/shm").free >= a.mid_shm_need_gb * 1e9:
            return Path("/dev/shm/e3mid")
    except OSError:
        pass
    return L.W / "mid"


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/live/demo")
    ap.add_argument("--budget-s", type=float, default=900)
    ap.add_argument("--site", default="/tmp/sglsite")
    ap.add_argument(
        "--device", default="cuda", help="cpu: bench/sglang_live_lanes.py --smoke (stand-in server)"
    )
    ap.add_argument(
        "--capture-via",
        choices=["playbooks", "cli"],
        default="playbooks",
        help="playbooks: playbooks/sglang.yml + playbooks/extract.yml with inventory/gpu-box (issue #17); "
        "cli: eagle3ops sglang-patch / sglang-extract",
    )
    ap.add_argument(
        "--rows",
        type=int,
        default=None,
        help="only the first N rows through SGLang, compared, and prefilled plainly (the CPU smoke run: the "
        "stand-in computes every row with transformers); default every row",
    )
    ap.add_argument("--assets", default="/tmp/assets")
    ap.add_argument(
        "--mid", action="store_true", help="also the capture overhead on a realistic-width target"
    )
    ap.add_argument(
        "--mid-tokenizer", default="/tmp/live/models/smollm2", help="lane smol's converted SmolLM2"
    )
    ap.add_argument("--mid-tokenizer-wait-s", type=float, default=300)
    ap.add_argument("--mid-dir", default="", help="default /dev/shm/e3mid where it has room, else WORK/mid")
    ap.add_argument("--mid-shm-need-gb", type=float, default=45)
    ap.add_argument("--mid-hidden", type=int, default=2048)
    ap.add_argument("--mid-layers", type=int, default=40)
    ap.add_argument("--mid-conversations", type=int, default=2000)
    ap.add_argument("--mid-rows", type=int, default=0, help="rows sent (0: all prepared)")
    ap.add_argument("--mid-concurrency", type=int, default=64)
    ap.add_argument("--gpu-window", default="", help="a file lane smol touches when it leaves the GPU idle")
    ap.add_argument("--gpu-window-wait-s", type=float, default=420)
    ap.add_argument("--mid-done", default="", help="a file touched when the measurement is over")
    return ap.parse_args()


def _recorder(w: Path):
    """``done(key, value)``: records into the result dict (returned too), rewrites WORK/result.json."""
    res: dict = {}
    lock = threading.Lock()

    def done(
        k, v
    ):  # lane demo's threads (--mid) record here too; replaced whole: a poll may copy it any time
        from eagle3ops.durable import atomic_write_text

        with lock:
            res[k] = v
            atomic_write_text(w / "result.json", json.dumps(res, indent=1, default=str), fsync=False)
        return v

    return done, res


def main() -> int:
    a = _parse_args()
    w = Path(a.work)
    w.mkdir(parents=True, exist_ok=True)
    L.W = w
    L.DEADLINE[0] = time.time() + a.budget_s
    done, res = _recorder(w)

    demo, tf, sg = w / "demo", w / "data-tf", w / "data-sgl"
    model = demo / "model"
    done("demo", L.cli("demo", "--out", str(demo), name="demo"))
    done("prepare", L.cli("prepare", "--model", str(model), "--input", str(demo / "conversations.jsonl"),
                          "--out", str(tf), name="prepare"))  # fmt: skip
    if not (tf / "prepare_meta.json").exists():
        return 1
    shutil.rmtree(sg, ignore_errors=True)
    shutil.copytree(tf, sg)
    done("extract_transformers", L.cli("extract", "--data", str(tf), "--model", str(model), "--device", a.device,
                                       "--workers", "1", "--no-progress", name="extract_tf"))  # fmt: skip
    mid, mid_threads = _capture(a, done, res, model, tf, sg)
    if mid is not None:
        for t in mid_threads:
            t.join(timeout=max(0.0, L.left() - 300))
        measuring = threading.Thread(target=mid.measure, name="mid-measure")
        measuring.start()
        mid_threads.append(measuring)
    elif a.mid_done:
        Path(a.mid_done).touch()
    try:
        done("compare", compare(tf, sg, a.rows))
    except Exception as e:
        done("compare", {"error": f"{type(e).__name__}: {e}"})
    return _train_serve_benchmark(a, done, res, w, demo, model, tf, mid_threads)


def _capture(a, done, res: dict, model: Path, tf: Path, sg: Path):
    """The SGLang store: the capture patch, the server, the extraction through it (playbooks or CLI), the
    capture overhead, then the server stopped and the patch restored whatever happened. With ``--mid`` the
    realistic-width target is prepared meanwhile and its server started while the patch is in place.
    Returns (the Mid or None, its threads)."""
    meta = json.loads((tf / "hidden_states" / "extract_meta.json").read_text())
    ids = [int(i) for i in meta["layer_ids"]]
    site = ["--site-packages", a.site, "--sglang-version", SGLANG_VERSION]
    target = Path(a.site) / "sglang/srt/models/deepseek_v2.py"
    done("deepseek_v2_sha256_before", sha256(target))
    done("patch_status_before", L.cli("sglang-patch", "status", *site, name="patch_status0"))
    env = capture_env(sg, ids)
    srv = capture_server(a, model, ids)
    # the playbooks' variables: SGLang where pip --target put it, extraction through it, the harness's server
    ev = {
        "eagle3ops_model_path": str(model), "eagle3ops_data_dir": str(sg), "eagle3ops_sglang_site_packages": a.site,
        "eagle3ops_sglang_version": SGLANG_VERSION, "eagle3ops_extract_backend": "sglang",
        # auto looks for /dev/nvidiactl: the box has it, the CPU smoke run does not
        "sglang_enabled": True, "sglang_layer_ids": ids, "extract_layer_ids": ids,
        "extract_sglang_url": srv.url, "extract_sglang_concurrency": 32, "extract_sglang_health_timeout": 120,
        "extract_poll_interval": 2, "eagle3ops_extract_limit": a.rows,
    }  # fmt: skip
    mid = Mid(a, done) if a.mid else None
    mid_threads: list = []
    if mid is not None:
        prep = threading.Thread(target=mid.prepare, name="mid-prepare")
        prep.start()

        def after_patch():
            t = threading.Thread(target=mid.start, args=(prep,), name="mid-start")
            t.start()
            mid_threads.append(t)
            return t
    else:
        after_patch = None
    try:
        if a.capture_via == "playbooks":
            r = capture_playbooks(done, srv, env, ev, after_patch)
        else:
            r = capture_cli(done, srv, env, sg, model, site, a.rows, after_patch)
        done("capture_overhead", plain_prefills(srv, tf, r, a.rows))
    except Exception as e:  # the restore below must run whatever happened
        done("server_error", f"{type(e).__name__}: {e}")
    finally:
        srv.stop()
        _restore_and_rerun(a, done, res, site, target, ev)
    return mid, mid_threads


def _restore_and_rerun(a, done, res: dict, site: list[str], target: Path, ev: dict) -> None:
    """After the server stopped: the patch restored (CLI, or the sglang role's own restore where the extract
    role did not), both playbooks once more (nothing may change), the file byte-exact as before."""
    if a.capture_via == "cli":
        done("patch_restore", L.cli("sglang-patch", "restore", *site, name="patch_restore"))
    elif sha256(target) != res["deepseek_v2_sha256_before"]:
        # the extract role restores only after a run without a failed row: the sglang role's own restore
        done("patch_restore_fallback", L.run_playbooks(
            "demo-restore", {**ev, "sglang_capture_patch_state": "absent"}, timeout=max(60, L.left() - 60),
            playbooks=("sglang.yml",), keep=(PATCH_TASK,)))  # fmt: skip
    if a.capture_via == "playbooks" and res.get("extract_playbook", {}).get("rc") == 0:
        # both phases once more, the server stopped: every row is extracted, so nothing may change (after a
        # failed extraction rows are left and sglang.yml would rightly patch again: not run then)
        rerun = L.run_playbooks("demo-rerun", ev, timeout=max(60, L.left() - 60),
                                playbooks=("sglang.yml", "extract.yml"), keep=(PATCH_TASK, RESTORE_TASK))  # fmt: skip
        rerun["changed_zero"] = (
            rerun.get("rc") == 0
            and all(h.get("changed") == 0 for h in rerun.get("stats", {}).values())
            and bool(rerun.get("stats"))
        )
        done("playbook_rerun", rerun)
    done("patch_status_after", L.cli("sglang-patch", "status", *site, name="patch_status1"))
    done("deepseek_v2_exists", target.exists())
    done("restored_byte_exact", sha256(target) == res["deepseek_v2_sha256_before"])


def _train_serve_benchmark(
    a, done, res: dict, w: Path, demo: Path, model: Path, tf: Path, mid_threads: list
) -> int:
    """A demo draft, then the serve + benchmark phases (the roles) against the real server."""
    run = w / "run"
    done("train", L.cli("train", "--data", str(tf), "--verifier", str(model), "--run-dir", str(run), "--device",
                        "gpu" if a.device == "cuda" else "cpu", "--epochs", "2", "--total-seq-len", "2048",
                        "--launcher", "setsid", "--wait", "--timeout", str(int(max(60, min(300, L.left() - 240)))),
                        "--no-gpu-free-check", "--draft-attn-impl", "sdpa", "--loss-implementation", "eager",
                        "--env", json.dumps({"TORCH_COMPILE_DISABLE": "1"}), name="train"))  # fmt: skip
    if res["train"].get("status") not in ("finished", "done"):  # what it saved so far is served
        done("train_stop", L.cli("train-stop", "--run-dir", str(run), "--grace", "20", name="train_stop"))
    if L.left() < 150:
        done("playbook", {"skipped": f"{L.left():.0f} s left"})
        for t in mid_threads:
            t.join()
        return 0
    ev = {
        "eagle3ops_checkpoint": str(run), "eagle3ops_model_path": str(model),
        "serve_port": 30050, "serve_baseline_port": 30051,
        "eagle3ops_sglang_site_packages": a.site, "eagle3ops_sglang_version": SGLANG_VERSION,
        # the demo target is random: its draft accepts little (offline ~1.1), so the floor is set just above 1.00
        # (what a draft that is never accepted gives); the smol lane's guard uses the default floor
        "serve_min_accept_length": 1.01,
        "serve_probe_prompts": str(demo / "heldout.jsonl"),
        "benchmark_target_path": str(model), "benchmark_prompts": str(demo / "heldout.jsonl"),
        "benchmark_limit": 8, "benchmark_prompt_sets": {"heldout": str(demo / "heldout.jsonl")},
        "benchmark_training_data": [str(demo / "conversations.jsonl")],
    }  # fmt: skip
    if os.environ.get("LIVE_SERVER_CMD"):
        ev["serve_server_command"] = L.SERVER_CMD
    done("playbook", L.run_playbooks("demo", ev, timeout=max(60, L.left() - 20)))
    if a.device == "cpu":  # the smoke run leaves no stand-in holding a port
        done("playbook_servers_stopped", L.stop_playbook_servers("demo"))
    for t in mid_threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())

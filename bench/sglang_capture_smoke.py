"""Live check of the SGLang capture patch on a real server (GPU box; SGLang installed under --site).

Applies the patch for --sglang-version to the installed ``deepseek_v2.py``, starts a real ``sglang.launch_server``
on the demo target with the dump environment and the version's dump flags (eagle3ops.sglang.client.server_args),
sends the rows of --rows (token ids of prepared rows, rid ``e3o-<row>-<len>-0``, max_new_tokens 1) and compares
every file the in-server hook wrote with the transformers backend's file for the same row (--ref): token ids
equal, hidden states within bf16 tolerance. Then stops the server and restores the patch byte-exact.
Prints one JSON object on the last line (and writes it to --out).

Status: written for the lead's live run on the H200 box (0.5.17 wheelhouse: shared/gpu-box/sglang-wheelhouse.sh);
NOT run yet (the device tool of the session that wrote it carried another checkout), so no result is in
bench/results/.

    python3 bench/sglang_capture_smoke.py --site /tmp/sglsite --model work/demo/model \
        --rows .gpucarry/rows.json --ref .gpucarry/ref --out $OUT/capture.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _post(url, body, timeout=300):
    r = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    return json.loads(urllib.request.urlopen(r, timeout=timeout).read())


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--site", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", required=True, help="JSON: {layer_ids, meta, rows: {index: [token ids]}}")
    ap.add_argument("--ref", required=True, help="the transformers backend's hs_<i>.safetensors files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--sglang-version", default="0.5.17")
    ap.add_argument("--port", type=int, default=30123)
    ap.add_argument("--log", default="/tmp/sglang-capture-smoke.log")
    return ap.parse_args()


def _wait_healthy(proc: subprocess.Popen, base: str) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}")
        try:
            urllib.request.urlopen(base + "/health", timeout=2)
            break
        except Exception:
            time.sleep(1)
    else:
        raise RuntimeError("no /health after 300 s")


def _compare(rows: dict, store, ref_dir: str) -> list[dict]:
    """Each row's file from the server hook against the transformers backend's (``ref_dir``)."""
    import torch
    from safetensors.torch import load_file

    cmp = []
    for i, ids in rows.items():
        p = store.path(i)
        if not p.exists():
            cmp.append({"row": i, "missing": True})
            continue
        got, ref = load_file(str(p)), load_file(str(Path(ref_dir) / p.name))
        g, r = got["hidden_states"].float(), ref["hidden_states"].float()
        err = (g - r).abs()
        cmp.append(
            {
                "row": i,
                "tokens": len(ids),
                "token_ids_equal": bool(torch.equal(got["token_ids"], ref["token_ids"])),
                "shape": list(g.shape),
                "max_abs_err": float(err.max()),
                "max_rel_err_per_slot": [
                    float(err[:, s].max() / r[:, s].abs().max()) for s in range(g.shape[1])
                ],
            }
        )
    return cmp


def main() -> int:
    args = _parse_args()
    sys.path[:0] = [args.site, str(REPO / "python")]
    # torch and safetensors (used by _compare) are imported here, before the patch is applied: one missing
    # fails the run before anything is changed
    import torch  # noqa: F401
    from eagle3ops.sglang import patch as sglang_patch
    from eagle3ops.sglang.client import server_args
    from eagle3ops.sglang.hook import make_rid
    from eagle3ops.store import HiddenStateStore
    from safetensors.torch import load_file  # noqa: F401

    res: dict = {"sglang_version": args.sglang_version}
    spec = json.loads(Path(args.rows).read_text())
    layer_ids = spec["layer_ids"]
    target = Path(args.site) / sglang_patch.TARGET_RELPATH
    res["patch_apply"] = {
        k: v
        for k, v in sglang_patch.apply(target, args.sglang_version).items()
        if k in ("state", "changed", "sha256")
    }
    dump = Path("/tmp/e3o-dump")
    shutil.rmtree(dump, ignore_errors=True)
    dump.mkdir()
    HiddenStateStore(dump, rank=0).ensure_meta(spec["meta"])
    env = {
        **os.environ,
        "PYTHONPATH": f"{args.site}:{REPO / 'python'}",
        "EAGLE3OPS_SGLANG_DUMP_DIR": str(dump),
        "EAGLE3OPS_SGLANG_LAYER_IDS": ",".join(map(str, layer_ids)),
        "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
        "PYTHONUNBUFFERED": "1",
    }
    argv = server_args(
        model_path=args.model,
        layer_ids=layer_ids,
        port=args.port,
        sglang_version=args.sglang_version,
        extra=[
            "--dtype", "bfloat16", "--attention-backend", "triton", "--sampling-backend", "pytorch",
            "--grammar-backend", "none", "--disable-cuda-graph", "--mem-fraction-static", "0.25",
            "--skip-server-warmup",
        ],
    )  # fmt: skip
    res["server_argv"] = argv
    log = open(args.log, "w")  # noqa: SIM115 (the server writes it until the finally below)
    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", *argv], env=env, stdout=log, stderr=log
    )
    base = f"http://127.0.0.1:{args.port}"
    try:
        _wait_healthy(proc, base)
        res["healthy_after_s"] = round(time.time() - t0, 1)
        rows = {int(k): v for k, v in spec["rows"].items()}
        t1 = time.time()
        for i, ids in rows.items():
            _post(
                base + "/generate",
                {
                    "input_ids": ids,
                    "rid": make_rid(i, len(ids)),
                    "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                },
            )
        res["request_seconds"] = round(time.time() - t1, 2)
        store = HiddenStateStore(dump, rank=0)
        deadline = time.time() + 60
        while time.time() < deadline and not all(store.path(i).exists() for i in rows):
            time.sleep(0.5)
        res["rows"] = _compare(rows, store, args.ref)
        errs = dump / "hidden_states" / "sglang_hook_errors.jsonl"
        res["hook_errors"] = errs.read_text().splitlines()[-5:] if errs.exists() else []
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        res["log_tail"] = Path(args.log).read_text()[-4000:]
        r = sglang_patch.restore(target, args.sglang_version)
        res["patch_restore"] = {
            k: v for k, v in r.items() if k in ("state", "changed", "sha256", "restored_from")
        }
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "log_tail"}))
    return 0 if "error" not in res else 1


if __name__ == "__main__":
    sys.exit(main())

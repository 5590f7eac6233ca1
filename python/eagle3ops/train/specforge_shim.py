"""Entry point of one SpecForge training process: ``[torchrun -m] eagle3ops.train.specforge_shim --config C``.

What the ``train`` phase launches for ``trainer: specforge`` (the twin of :mod:`eagle3ops.train.speculators_shim`): it
runs ``specforge train --config C`` in this process (under torchrun, SpecForge sees the worker environment and
launches nothing of its own), and adds what the phase needs around it:

- **resume**: a relaunched run continues from its newest complete checkpoint (SpecForge's ``{run_id}-latest``
  under its output directory) through SpecForge's own ``training.resume_from`` override, so the rendered config,
  which the phase compares between runs, stays the same;
- **metrics**: SpecForge prints one ``step N: {...}`` line per log interval; rank 0 appends each as a JSON record
  to ``$EAGLE3OPS_METRICS`` (the phase's ``metrics.jsonl``) when the run ends;
- **an honest exit record** (``$EAGLE3OPS_EXIT``): ``finished`` only when SpecForge returned 0 and a checkpoint
  exists; ``interrupted`` for a stop by signal (SpecForge returns 128 + the signal: it saves nothing then, the
  run resumes from its last periodic save), ``failed`` otherwise.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import traceback
from pathlib import Path

from eagle3ops.train.specforge import (
    SPECFORGE_PIN,
    installed_version,
    latest_checkpoint,
    metrics_from_log,
    output_dir,
)
from eagle3ops.train.speculators_shim import write_exit

ENV_METRICS = "EAGLE3OPS_METRICS"


class _Tee(io.TextIOBase):
    """stdout as before, and a copy kept to read SpecForge's metric lines from at the end, with the time each
    ``step N:`` line was printed (the run's step rate, which SpecForge does not log)."""

    def __init__(self, out):
        self.out, self.kept, self.times = out, io.StringIO(), {}

    def write(self, s):
        if s.startswith("step "):
            head = s[5:].split(":", 1)[0]
            if head.isdigit():
                self.times[int(head)] = round(time.time(), 3)
        self.kept.write(s)
        return self.out.write(s)

    def flush(self):
        self.out.flush()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    started = time.time()
    if len(argv) != 2 or argv[0] != "--config":
        print("usage: python -m eagle3ops.train.specforge_shim --config RUN/config.yaml", file=sys.stderr)
        return 2
    cfg_path = Path(argv[1]).resolve()
    version = installed_version()
    if version != SPECFORGE_PIN:
        msg = (
            f"specforge {version or 'is not installed'} in {sys.prefix}; the train phase's SpecForge backend is "
            f"written for specforge=={SPECFORGE_PIN} (install it with --no-deps: requirements/speculators.txt)"
        )
        print(f"eagle3ops.train.specforge_shim: {msg}", file=sys.stderr)
        write_exit("failed", rc=2, error=msg)
        return 2
    output = output_dir(cfg_path.parent)
    overrides = []
    resume = latest_checkpoint(output)
    if resume is not None:
        overrides.append(f"training.resume_from={resume}")
    rank = int(os.environ.get("RANK", "0"))
    print(
        f"eagle3ops.train.specforge_shim: specforge {version}, rank {rank}, pid {os.getpid()}"
        + (f", resuming from {resume}" if resume else ""),
        file=sys.stderr,
        flush=True,
    )
    from specforge.cli import main as specforge_main

    tee = _Tee(sys.stdout)
    rc = 1
    try:
        with contextlib.redirect_stdout(tee):
            rc = specforge_main(["train", "--config", str(cfg_path), *overrides])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException as e:
        write_exit("failed", rc=1, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
        raise
    finally:
        path = os.environ.get(ENV_METRICS)
        if path and rank == 0:
            with open(path, "a") as f:
                for rec in metrics_from_log(tee.kept.getvalue()):
                    t = tee.times.get(rec["step"])
                    f.write(json.dumps({"kind": "train", "step": rec["step"], "time": t, "data": rec}) + "\n")
    seconds = round(time.time() - started, 3)
    if rc == 0 and latest_checkpoint(output) is not None:
        write_exit("finished", rc=0, seconds=seconds, checkpoint=str(latest_checkpoint(output)))
        return 0
    if rc in (128 + 1, 128 + 2, 128 + 15):
        write_exit("interrupted", rc=rc, signal=str(rc - 128), seconds=seconds)
        return rc
    write_exit(
        "failed", rc=rc or 1, error=f"specforge train exited {rc}" + ("" if rc else " without a checkpoint")
    )
    return rc or 1


if __name__ == "__main__":
    sys.exit(main())

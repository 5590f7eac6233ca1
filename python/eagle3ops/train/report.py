"""The train role's report line for this node (roles/train/tasks/main.yml, printed by
action_plugins/eagle3ops_report.py): the run as it stands, or in check mode what the module would do. The job
over every node is eagle3ops.train.nodes' summary. Standard library only: the controller imports it."""

from __future__ import annotations


def line(result: dict, check_mode: bool, multinode: bool = False, rdzv_endpoint: str = "") -> str:
    """``result``: the eagle3ops_train module's return; ``multinode``/``rdzv_endpoint``: the job spans several
    nodes, which meet there."""
    if check_mode:
        would = result["would"] if "would" in result else f"leave it: {result.get('status')}"
        return f"would {would} run {result.get('run_dir')}"
    r, metrics = result, result.get("metrics") or {}
    node = f", node {r.get('node_rank')} of {r.get('nnodes')} via {rdzv_endpoint}" if multinode else ""
    return (
        f"run {r.get('run_dir')}: {r.get('status')} (attempt {r.get('attempt')}, PID {r.get('pid')}, "
        f"{r.get('device')} x{r.get('nproc')}{node}); layers {r.get('layer_ids')}, draft vocab "
        f"{r.get('draft_vocab_size')}; step {metrics.get('global_step', '-')}, val loss "
        f"{metrics.get('val_loss', '-')}, val accuracy per position {metrics.get('val_cond_acc', '-')}"
        f"{resumed(r)}; log {r.get('log_path')}"
    )


def resumed(result: dict) -> str:
    """What the last attempt's resume check compared (its exit record's ``resume_check``), or nothing when it did
    not resume."""
    c = (result.get("exit") or {}).get("resume_check") or {}
    if not c:
        return ""
    if c.get("equal") is None:
        return f"; resumed from epoch {c.get('epoch')}: {c.get('note', 'optimizer state not compared')}"
    return (
        f"; resumed from epoch {c.get('epoch')}, the optimizer state restored equal to {c.get('file')} "
        f"({c.get('parameters')} parameters, {c.get('tensors')} tensors)"
    )

"""After a resume: is the optimizer state each rank restored the one the checkpoint saved?

speculators saves the optimizer state on rank 0 only (``optimizer_state_dict.pt``, floats in bf16) and every
rank loads it on resume. A rank that silently starts from an empty or different state trains on with moments
that no longer match its weights: the loss looks fine and the draft comes out worse (users' pain 15). The
train phase's shim (:mod:`.speculators_shim`) runs :func:`problem` on every rank right after the trainer
restored its optimizers, and stops the run with exit 2 naming the checkpoint file and the first difference.

Equal means: the same optimizers, the same parameter slots, and in each slot the same entries, every tensor
equal to the saved one once cast to the saved dtype (the loader casts bf16 up to the parameters' dtype, which
is exact, so casting back must give the saved bits); other values equal as they are.
"""

from __future__ import annotations


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _compare_slot(where: str, saved: dict, restored: dict) -> tuple[str | None, int]:
    import torch

    tensors = 0
    for key in sorted(set(saved) | set(restored), key=str):
        if key not in restored:
            return f"{where}: {key!r} was saved but not restored", tensors
        if key not in saved:
            return f"{where}: {key!r} was restored but is not in the saved state", tensors
        s, r = saved[key], restored[key]
        if isinstance(s, torch.Tensor) and isinstance(r, torch.Tensor):
            if tuple(s.shape) != tuple(r.shape):
                return f"{where}: {key!r} has shape {tuple(r.shape)}, saved {tuple(s.shape)}", tensors
            # compared where the restored tensor lives (the GPU in a real run: no host copy of each moment)
            back, s = r.detach().to(dtype=s.dtype), s.to(device=r.device)
            if not torch.equal(back, s):
                if s.numel() == 1:
                    return f"{where}: {key!r} is {back.item()}, saved {s.item()}", tensors
                gap = (back.float() - s.float()).abs().max().item()
                return (
                    f"{where}: {key!r} differs from the saved values (max abs difference {gap:.3g})",
                    tensors,
                )
            tensors += 1
        elif isinstance(s, torch.Tensor) or isinstance(r, torch.Tensor):
            a = s.item() if isinstance(s, torch.Tensor) else s
            b = r.item() if isinstance(r, torch.Tensor) else r
            if float(a) != float(b):
                return f"{where}: {key!r} is {b}, saved {a}", tensors
        elif s != r:
            return f"{where}: {key!r} is {r!r}, saved {s!r}", tensors
    return None, tensors


def problem(saved, optimizers) -> tuple[str | None, dict]:
    """``saved``: what ``torch.load`` gives of ``optimizer_state_dict.pt`` (one state dict or a list, one per
    optimizer); ``optimizers``: the restored optimizer(s). (None, counts) when every optimizer holds the saved
    state, else (the first difference, counts so far)."""
    saved_list, opts = _as_list(saved), _as_list(optimizers)
    counts = {"optimizers": len(opts), "parameters": 0, "tensors": 0}
    if len(saved_list) != len(opts):
        return f"{len(saved_list)} optimizer state(s) saved, {len(opts)} optimizer(s) restored", counts
    for i, (s, opt) in enumerate(zip(saved_list, opts, strict=True)):
        r = opt.state_dict()
        if len(s.get("param_groups", [])) != len(r.get("param_groups", [])):
            return (
                f"optimizer {i}: {len(r['param_groups'])} parameter groups, saved {len(s['param_groups'])}",
                counts,
            )
        ss, rs = s.get("state", {}), r.get("state", {})
        if not rs and ss:
            return f"optimizer {i}: no state restored ({len(ss)} parameters' state saved)", counts
        for slot in sorted(set(ss) | set(rs), key=str):
            if slot not in rs:
                return f"optimizer {i}, parameter {slot}: saved but not restored", counts
            if slot not in ss:
                return f"optimizer {i}, parameter {slot}: restored but not in the saved state", counts
            msg, n = _compare_slot(f"optimizer {i}, parameter {slot}", ss[slot], rs[slot])
            counts["tensors"] += n
            if msg:
                return msg, counts
            counts["parameters"] += 1
    return None, counts

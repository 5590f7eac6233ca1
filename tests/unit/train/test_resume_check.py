"""The resume check (users' pain 15: per-rank optimizer state lost on resume): after a restore, each rank's
optimizers must hold exactly what ``optimizer_state_dict.pt`` saved. Real torch AdamW optimizers, saved as
speculators saves them (floats cast to bf16, ``torch.save``) and restored as it restores them (cast back up,
``load_state_dict``); the broken restores are the ones a rank can suffer: nothing loaded, a slot dropped, other
values, another optimizer count."""

from __future__ import annotations

import torch
from eagle3ops.train import resume_check


def _trained(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
    return model, opt


def _bf16(sd: dict) -> dict:
    out = {"param_groups": sd["param_groups"], "state": {}}
    for slot, st in sd["state"].items():
        out["state"][slot] = {
            k: v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() and k != "step" else v
            for k, v in st.items()
        }
    return out


def _saved(opt, tmp_path):
    path = tmp_path / "optimizer_state_dict.pt"
    torch.save(_bf16(opt.state_dict()), path)
    return torch.load(path, weights_only=True, map_location="cpu", mmap=True)


def _restored(saved, model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    up = {"param_groups": saved["param_groups"], "state": {}}
    for slot, st in saved["state"].items():
        up["state"][slot] = {k: v.float().clone() if torch.is_tensor(v) else v for k, v in st.items()}
    opt.load_state_dict(up)
    return opt


def test_a_faithful_restore_is_equal_and_counted(tmp_path):
    model, opt = _trained()
    saved = _saved(opt, tmp_path)
    msg, counts = resume_check.problem(saved, _restored(saved, model))
    assert msg is None
    # 4 parameters (2 weights, 2 biases), each with step, exp_avg, exp_avg_sq
    assert counts == {"optimizers": 1, "parameters": 4, "tensors": 12}
    assert resume_check.problem([saved], [_restored(saved, model)])[0] is None  # speculators' list form


def test_every_broken_restore_is_named(tmp_path):
    model, opt = _trained()
    saved = _saved(opt, tmp_path)
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-2)
    assert (
        resume_check.problem(saved, fresh)[0] == "optimizer 0: no state restored (4 parameters' state saved)"
    )
    dropped = _restored(saved, model)
    del dropped.state[next(iter(model.parameters()))]
    assert resume_check.problem(saved, dropped)[0] == "optimizer 0, parameter 0: saved but not restored"
    (tmp_path / "other").mkdir()
    other = _restored(_saved(_trained(seed=1)[1], tmp_path / "other"), model)
    assert resume_check.problem(saved, other)[0].startswith(
        "optimizer 0, parameter 0: 'exp_avg' differs from the saved values (max abs difference "
    )
    late = _restored(saved, model)
    late.state[next(iter(model.parameters()))]["step"] += 1
    assert resume_check.problem(saved, late)[0] == "optimizer 0, parameter 0: 'step' is 4.0, saved 3.0"
    assert resume_check.problem([saved, saved], [_restored(saved, model)])[0] == (
        "2 optimizer state(s) saved, 1 optimizer(s) restored"
    )

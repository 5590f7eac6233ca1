"""The train role's line for one node (eagle3ops.train.report, printed by action_plugins/eagle3ops_report.py from
roles/train/tasks/main.yml); the job over every node is tests/unit/train/test_train_nodes.py's."""

from __future__ import annotations

from eagle3ops.train.report import line

RUN = {"run_dir": "/r", "status": "running", "attempt": 1, "pid": 42, "device": "cuda", "nproc": 8, "layer_ids": [2],
       "draft_vocab_size": 32000, "metrics": {"global_step": 10, "val_loss": None}, "log_path": "/r/log"}  # fmt: skip


def test_train_line_for_one_node_and_several():
    assert line(RUN, False) == (
        "run /r: running (attempt 1, PID 42, cuda x8); layers [2], draft vocab 32000; step 10, val loss None, "
        "val accuracy per position -; log /r/log"
    )
    several = line({**RUN, "node_rank": 1, "nnodes": 2}, False, True, "10.0.0.1:29400")
    assert "(attempt 1, PID 42, cuda x8, node 1 of 2 via 10.0.0.1:29400);" in several


def test_train_check_mode_says_what_the_module_would_do():
    assert line({"would": "launch", "run_dir": "/r"}, True) == "would launch run /r"
    assert line({"status": "finished", "run_dir": "/r"}, True) == "would leave it: finished run /r"


def test_a_resumed_run_says_its_optimizer_state_was_checked():
    check = {"file": "/r/checkpoints/0/optimizer_state_dict.pt", "epoch": 0, "rank": 0, "equal": True,
             "optimizers": 1, "parameters": 9, "tensors": 27}  # fmt: skip
    done = line({**RUN, "status": "finished", "exit": {"status": "finished", "resume_check": check}}, False)
    assert done.endswith(
        "val accuracy per position -; resumed from epoch 0, the optimizer state restored equal to "
        "/r/checkpoints/0/optimizer_state_dict.pt (9 parameters, 27 tensors); log /r/log"
    )
    sharded = {"epoch": 2, "equal": None, "note": "FSDP-sharded optimizer state: not compared"}
    assert "; resumed from epoch 2: FSDP-sharded optimizer state: not compared;" in line(
        {**RUN, "exit": {"resume_check": sharded}}, False
    )
    assert "resumed" not in line({**RUN, "exit": {"status": "finished"}}, False)

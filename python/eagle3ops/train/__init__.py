"""The train phase: an EAGLE-3 draft trained by speculators 0.9.0 as an idempotent, detached task.

- :mod:`.options`: the phase's option definitions; :mod:`.commands`: ``eagle3ops train``, ``train-status``,
  ``train-stop``;
- :mod:`.run`: the state machine of a run directory (launch, running, finished, relaunch, restart on change);
- :mod:`.spec`: a run's settings and files; :mod:`.inputs`: the extraction's meta, the verifier, the samples,
  the draft vocabulary; :mod:`.planning`: the device, the nodes, the rendered config, torchrun's command line;
- :mod:`.launch`: the detached trainer (systemd unit or setsid), found by PID and command line, stopped;
  :mod:`.metrics`: ``metrics.jsonl``;
- :mod:`.speculators_shim` (one training process: ``python -m eagle3ops.train.speculators_shim``) and
  :mod:`.ddp_probe` (the minimal DDP job: ``python -m eagle3ops.train.ddp_probe``): the trainers torchrun starts;
- :mod:`.fixtures`: self-made training inputs for the tests and the GPU benchmark (a test fixture, shipped);
- checkpoints of a save directory: :mod:`eagle3ops.checkpoints` (shared with serve and benchmark).
"""

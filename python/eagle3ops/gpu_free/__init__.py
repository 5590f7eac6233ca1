"""The gpu_free phase: the verification checkpoint before training, every selected GPU's memory free, its
holders named, only allow-listed ones stopped.

- :mod:`.options`: the phase's option definitions; :mod:`.commands`: ``eagle3ops gpu-free``;
- :mod:`.check`: the check (:func:`.check.ensure_free`) and what "free" means; :mod:`.nvml`: devices and memory;
- :mod:`.holders`: who holds a GPU (``/proc``, cgroups, device files) and the allow-list; :mod:`.stop`: stopping.
"""

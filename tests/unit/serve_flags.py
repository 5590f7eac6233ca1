"""What the serve role's server command holds when the backends are the lent GPU box's (inventory/gpu-box:
its trimmed sgl-kernel has no FA3 kernels, so triton attention for target and draft, the pytorch sampler, no
grammar backend, no CUDA graphs), for the tests that render or run that command."""

from __future__ import annotations

BOX_BACKEND_FLAGS = (
    "--dtype bfloat16",
    "--attention-backend triton",
    "--speculative-draft-attention-backend triton",
    "--sampling-backend pytorch",
    "--grammar-backend none",
    "--disable-prefill-cuda-graph --disable-decode-cuda-graph",
)

"""One module per CLI sub-command; each defines ``register(subparsers)`` (see eagle3ops.cli)."""

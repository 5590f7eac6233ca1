"""One module per CLI sub-command; each defines ``register(subparsers)`` (see eagle3ops.cli: the tools that belong to no phase; a phase registers its own in eagle3ops.<phase>.commands)."""

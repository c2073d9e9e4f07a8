"""The `dharma` command: one module per command group."""

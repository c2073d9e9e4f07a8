"""State the stages keep between calls, behind small Protocols: limiter, breaker, approvals, idempotency, sessions.

Memory implementations live here; SQLite (approvals, shared with the CLI) has its own module.
"""

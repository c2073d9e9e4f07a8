"""Dharma Gateway: policy-as-code governance for AI-agent tool calls."""

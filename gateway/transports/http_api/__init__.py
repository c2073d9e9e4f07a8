"""The HTTP front (`dharma serve`): the tool API under `/v1`, approvals, JWKS and health (`app`)."""

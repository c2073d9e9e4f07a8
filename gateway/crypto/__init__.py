"""Keys and signatures: the Ed25519 key store and JWKS (`keys`), signed receipts (`receipts`),
JWT validation for HTTP authentication (`jwt`)."""

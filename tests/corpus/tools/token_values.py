"""Random credentials in the formats vendors issue, for the corpus's `encoded_secrets` cases.

    python tests/corpus/tools/token_values.py [--seed N]

prints one value of each format from a seeded generator, so a case's value can be regenerated:
AWS access key ids and secret keys, GitHub and npm tokens (30 random base62 characters and their
CRC32 checksum in base62, as both vendors issue them), Slack bot tokens, Stripe secret and
publishable keys, Anthropic- and OpenAI-style keys, Google API keys, GitLab and Hugging Face
tokens, JWTs (HS256, signed with a random key) and PEM/OpenSSH private keys (EC P-256, Ed25519).
The values are random: no account is behind them, and none is a documented example value
(those stay allowed by design).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import random
import sys
import zlib

BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
URLSAFE = BASE62 + "-_"


def pick(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def base62_checksum(body: str) -> str:
    """CRC32 of `body` in base62, left-padded to 6 characters (GitHub's and npm's token checksum)."""
    n, out = zlib.crc32(body.encode()), ""
    while n:
        n, r = divmod(n, 62)
        out = BASE62[r] + out
    return out.rjust(6, "0")


def checksummed(rng: random.Random, prefix: str) -> str:
    body = pick(rng, BASE62, 30)
    return prefix + body + base62_checksum(body)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def jwt(rng: random.Random) -> str:
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    user = rng.randrange(10_000, 99_999)
    claims = {"sub": f"user_{user}", "email": f"u{user}@corp.example", "scope": "repo:read admin", "iat": 1764300000,
              "exp": 1764303600}
    payload = b64url(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(rng.randbytes(32), f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64url(signature)}"


def pem_keys(seed: int) -> dict[str, str]:
    """An EC P-256 key (PKCS#8 PEM) and an Ed25519 key (OpenSSH format), from `seed`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    digest = hashlib.sha256(f"token_values:{seed}".encode()).digest()
    ec_key = ec.derive_private_key(int.from_bytes(digest, "big") % (2**255), ec.SECP256R1())
    ed_key = ed25519.Ed25519PrivateKey.from_private_bytes(hashlib.sha256(digest).digest())
    none = serialization.NoEncryption()
    return {
        "pem_ec": ec_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, none).decode(),
        "openssh_ed25519": ed_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, none).decode(),
    }


def values(seed: int) -> dict[str, str]:
    rng = random.Random(seed)
    out = {
        "aws_key_id": "AKIA" + pick(rng, BASE32, 16),
        "aws_secret": pick(rng, BASE62 + "+/", 40),
        "github": checksummed(rng, "ghp_"),
        "github_fine": "github_pat_" + pick(rng, BASE62, 22) + "_" + pick(rng, BASE62, 59),
        "npm": checksummed(rng, "npm_"),
        "slack_bot": f"xoxb-{rng.randrange(10**10, 10**11)}-{rng.randrange(10**12, 10**13)}-{pick(rng, BASE62, 24)}",
        "stripe_secret": "sk_live_51" + pick(rng, BASE62, 97),
        "stripe_restricted": "rk_live_51" + pick(rng, BASE62, 97),
        "stripe_publishable": "pk_live_51" + pick(rng, BASE62, 97),
        "anthropic": "sk-ant-api03-" + pick(rng, URLSAFE, 93) + "AA",
        "openai": "sk-proj-" + pick(rng, URLSAFE, 74) + "T3BlbkFJ" + pick(rng, URLSAFE, 74),
        "google": "AIza" + pick(rng, URLSAFE, 35),
        "gitlab": "glpat-" + pick(rng, URLSAFE, 20),
        "huggingface": "hf_" + pick(rng, BASE62[10:], 34),
        "jwt": jwt(rng),
    }
    out.update(pem_keys(seed))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=24, help="generator seed (the issue-24 cases used 24 and up)")
    args = parser.parse_args(argv)
    for name, value in values(args.seed).items():
        print(f"{name:<18} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

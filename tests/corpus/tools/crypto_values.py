"""Valid crypto-wallet values for the corpus's `encoded_secrets` cases, reproducibly.

    python tests/corpus/tools/crypto_values.py [--seed N] [--count K]

prints BIP-39 seed phrases (12 and 24 words, correct checksum), WIF private keys (mainnet,
compressed, base58check) and Bitcoin addresses (P2PKH base58check, P2WPKH bech32) derived from
a seeded generator, so a case's value can be regenerated and checked. The values are random:
no real wallet is behind them.

The wordlist is BIP-39's English list (bip-0039/english.txt of github.com/bitcoin/bips, MIT),
shipped beside this file and checked against its published SHA-256 before use.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from pathlib import Path

WORDLIST = Path(__file__).resolve().parent / "bip39-english.txt"
WORDLIST_SHA256 = "2f5eed53a4727b4bf8880d8f3f199efc90e58503646d9ff8eff3a2ed3b24dbda"
B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"


def wordlist() -> list[str]:
    """The 2048 BIP-39 English words, after checking the file is the published one."""
    data = WORDLIST.read_bytes()
    if hashlib.sha256(data).hexdigest() != WORDLIST_SHA256:
        raise ValueError(f"{WORDLIST} is not the published BIP-39 English wordlist (SHA-256 mismatch)")
    words = data.decode("ascii").split()
    assert len(words) == 2048
    return words


def mnemonic(entropy: bytes) -> str:
    """The BIP-39 phrase of 16-32 bytes of entropy: the bits, then the first len/32 bits of
    SHA-256(entropy) as checksum, cut into 11-bit word indexes."""
    if len(entropy) not in (16, 20, 24, 28, 32):
        raise ValueError("entropy is 16, 20, 24, 28 or 32 bytes")
    bits = len(entropy) * 8
    value = int.from_bytes(entropy, "big") << (bits // 32) | hashlib.sha256(entropy).digest()[0] >> (8 - bits // 32)
    count = (bits + bits // 32) // 11
    words = wordlist()
    return " ".join(words[(value >> (11 * (count - 1 - i))) & 0x7FF] for i in range(count))


def mnemonic_is_valid(phrase: str) -> bool:
    """True if every word is in the list and the checksum bits match."""
    words = wordlist()
    index = {w: i for i, w in enumerate(words)}
    parts = phrase.split()
    if len(parts) not in (12, 15, 18, 21, 24) or any(p not in index for p in parts):
        return False
    value = 0
    for p in parts:
        value = value << 11 | index[p]
    checksum_bits = len(parts) * 11 // 33
    entropy = (value >> checksum_bits).to_bytes(len(parts) * 11 * 32 // 33 // 8, "big")
    return value & ((1 << checksum_bits) - 1) == hashlib.sha256(entropy).digest()[0] >> (8 - checksum_bits)


def base58check(payload: bytes) -> str:
    data = payload + hashlib.sha256(hashlib.sha256(payload).digest()).digest()[:4]
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, r = divmod(n, 58)
        out = B58[r] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def base58check_is_valid(text: str) -> bool:
    n = 0
    for ch in text:
        if ch not in B58:
            return False
        n = n * 58 + B58.index(ch)
    data = n.to_bytes((n.bit_length() + 7) // 8, "big")
    data = b"\0" * (len(text) - len(text.lstrip("1"))) + data
    return len(data) > 4 and hashlib.sha256(hashlib.sha256(data[:-4]).digest()).digest()[:4] == data[-4:]


def wif(key: bytes) -> str:
    """A mainnet WIF private key (compressed-pubkey flag) for a 32-byte secret."""
    return base58check(b"\x80" + key + b"\x01")


def p2pkh(hash160: bytes) -> str:
    return base58check(b"\x00" + hash160)


def _polymod(values: list[int]) -> int:
    gen = [0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3]
    chk = 1
    for v in values:
        top = chk >> 25
        chk = (chk & 0x1FFFFFF) << 5 ^ v
        for i in range(5):
            chk ^= gen[i] if (top >> i) & 1 else 0
    return chk


def p2wpkh(hash160: bytes, hrp: str = "bc") -> str:
    """A segwit v0 address (BIP-173 bech32) for a 20-byte key hash."""
    acc, bits, data = 0, 0, [0]
    for byte in hash160:
        acc = acc << 8 | byte
        bits += 8
        while bits >= 5:
            bits -= 5
            data.append(acc >> bits & 31)
    if bits:
        data.append(acc << (5 - bits) & 31)
    expanded = [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]
    mod = _polymod(expanded + data + [0] * 6) ^ 1
    return hrp + "1" + "".join(BECH32[d] for d in data + [mod >> 5 * (5 - i) & 31 for i in range(6)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=10, help="generator seed (the corpus used 10)")
    parser.add_argument("--count", type=int, default=4, help="values of each kind")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    for i in range(args.count):
        print(f"bip39-12  {mnemonic(rng.randbytes(16))}")
        print(f"bip39-24  {mnemonic(rng.randbytes(32))}")
        print(f"wif       {wif(rng.randbytes(32))}")
        print(f"p2pkh     {p2pkh(rng.randbytes(20))}")
        print(f"p2wpkh    {p2wpkh(rng.randbytes(20))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Crypto-wallet material in text: BIP-39 seed phrases, WIF and BIP-32 extended private keys, and wallet addresses.

Every candidate is checked the way a wallet would check it, so look-alikes do not match: a seed
phrase's checksum bits (SHA-256 of its entropy), a WIF key's and a base58 address's Base58Check
checksum (double SHA-256), a bech32/bech32m address's BCH checksum, and a mixed-case Ethereum
address's EIP-55 checksum (Keccak-256, written out here: hashlib's sha3_256 pads differently).
Seed phrases and WIF keys are secrets; addresses are public and reported so that rules can
combine them with where a call sends data. The BIP-39 English wordlist is the public data file
`data/bip39_english.txt`, read once, on the first text that looks like a word list.

Hits are `(kind, start, end, detail, excerpt)`. No I/O beyond reading that package file.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from importlib import resources
from typing import Final

__all__ = ["EXAMPLE_SEEDS", "bip39_words", "is_test_key", "keccak256", "wallet_hits"]

WalletHit = tuple[str, int, int, str, str]

_B58_ALPHABET: Final = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX: Final = {c: i for i, c in enumerate(_B58_ALPHABET)}
# Runs that can be a WIF key (5, K, L) or an address (1, 3); the first character comes before the
# lookbehind so that the regex engine skips to those characters.
_B58_RUN: Final = re.compile(r"[135KL](?<![1-9A-HJ-NP-Za-km-z][135KL])[1-9A-HJ-NP-Za-km-z]{24,51}(?![1-9A-HJ-NP-Za-km-z])")
# Literal first, lookbehind after: the regex engine then jumps between occurrences of the literal.
_BECH32: Final = re.compile(
    r"bc1(?<![A-Za-z0-9]bc1)[ac-hj-np-z02-9]{8,87}+(?![A-Za-z0-9])|BC1(?<![A-Za-z0-9]BC1)[AC-HJ-NP-Z02-9]{8,87}+(?![A-Za-z0-9])"
)
_BECH32_CHARSET: Final = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
_ETH: Final = re.compile(r"0x(?<![A-Za-z0-9]0x)[0-9a-fA-F]{40}(?![A-Za-z0-9])")
# 12+ lowercase words of 3-8 letters with only spaces, commas, numbering, `+` (a URL's query) or line breaks between them
# (possessive: a failed run is given up at once, never backtracked word by word)
_WORD_RUN: Final = re.compile(
    r"[a-z](?<![A-Za-z][a-z])[a-z]{2,7}+(?![A-Za-z])(?:[\s,;.:()\[\]#0-9+-]{1,8}+[a-z]{3,8}+(?![A-Za-z])){11,}+"
)
_WORD: Final = re.compile(r"[a-z]+")
_SEED_LENGTHS: Final = (24, 21, 18, 15, 12)

# BIP-39's published test mnemonics: in tutorials and test suites, never anyone's wallet.
EXAMPLE_SEEDS: Final = frozenset(
    {" ".join(["abandon"] * 11 + ["about"]), " ".join(["abandon"] * 17 + ["agent"]),
     " ".join(["abandon"] * 23 + ["art"]), " ".join(["zoo"] * 11 + ["wrong"]), " ".join(["zoo"] * 23 + ["vote"]),
     "legal winner thank year wave sausage worth useful legal winner thank yellow"}
)  # fmt: skip
# The Bitcoin wiki's worked WIF example (private key 0x0C28FCA3...).
_EXAMPLE_WIF: Final = frozenset({"5HueCGU8rMjxEXxiPuD5BDku4MkFqeZyd4dZ1jvhTVqvbTLvyTJ"})


@lru_cache(maxsize=1)
def bip39_words() -> dict[str, int]:
    """The BIP-39 English wordlist: word -> index (0..2047)."""
    text = resources.files("gateway.stages.sanitizer").joinpath("data/bip39_english.txt").read_text("ascii")
    words = text.split()
    if len(words) != 2048:
        raise RuntimeError(f"data/bip39_english.txt holds {len(words)} words, not 2048")
    return {w: i for i, w in enumerate(words)}


def _sha256d(data: bytes) -> bytes:
    return hashlib.sha256(hashlib.sha256(data).digest()).digest()


def b58decode(text: str) -> bytes:
    """The bytes a run of the Bitcoin base58 alphabet stands for (leading `1`s are zero bytes)."""
    n = 0
    for c in text:
        n = n * 58 + _B58_INDEX[c]
    zeros = len(text) - len(text.lstrip("1"))
    return b"\0" * zeros + n.to_bytes((n.bit_length() + 7) // 8, "big")


def b58check_decode(text: str) -> bytes | None:
    """The payload of a Base58Check string (version byte included), or None if the checksum fails."""
    return b58check_payload(b58decode(text))


def b58check_payload(raw: bytes) -> bytes | None:
    """Decoded Base58Check bytes without their 4-byte checksum, or None if the checksum fails."""
    if len(raw) < 5 or _sha256d(raw[:-4])[:4] != raw[-4:]:
        return None
    return raw[:-4]


def _bech32_polymod(values: list[int]) -> int:
    gen = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)
    chk = 1
    for v in values:
        top = chk >> 25
        chk = (chk & 0x1FFFFFF) << 5 ^ v
        for i in range(5):
            chk ^= gen[i] if (top >> i) & 1 else 0
    return chk


def _segwit_address(addr: str) -> str | None:
    """'bech32 (P2WPKH)' and the like for a valid bc1 address (BIP-173/350), else None."""
    addr = addr.lower()
    data = [_BECH32_CHARSET.index(c) for c in addr[3:]]
    const = _bech32_polymod([3, 3, 0, 2, 3] + data)  # hrp "bc" expanded
    if len(data) < 7 or not data[0] <= 16:
        return None
    version = data[0]
    if const != (1 if version == 0 else 0x2BC830A3):
        return None
    acc = bits = 0
    program = bytearray()
    for v in data[1:-6]:
        acc = acc << 5 | v
        bits += 5
        if bits >= 8:
            bits -= 8
            program.append(acc >> bits & 0xFF)
    if bits >= 5 or acc & ((1 << bits) - 1):
        return None
    if not 2 <= len(program) <= 40 or (version == 0 and len(program) not in (20, 32)):
        return None
    if version == 0:
        return "bech32 (P2WPKH)" if len(program) == 20 else "bech32 (P2WSH)"
    return "bech32m (taproot)" if version == 1 else f"bech32m (witness v{version})"


_KECCAK_RC: Final = (
    0x0000000000000001, 0x0000000000008082, 0x800000000000808A, 0x8000000080008000, 0x000000000000808B,
    0x0000000080000001, 0x8000000080008081, 0x8000000000008009, 0x000000000000008A, 0x0000000000000088,
    0x0000000080008009, 0x000000008000000A, 0x000000008000808B, 0x800000000000008B, 0x8000000000008089,
    0x8000000000008003, 0x8000000000008002, 0x8000000000000080, 0x000000000000800A, 0x800000008000000A,
    0x8000000080008081, 0x8000000000008080, 0x0000000080000001, 0x8000000080008008,
)  # fmt: skip
_KECCAK_ROT: Final = ((0, 36, 3, 41, 18), (1, 44, 10, 45, 2), (62, 6, 43, 15, 61), (28, 55, 25, 21, 56), (27, 20, 39, 8, 14))
_MASK64: Final = (1 << 64) - 1


def _rotl(v: int, n: int) -> int:
    return ((v << n) | (v >> (64 - n))) & _MASK64


def _keccak_f(a: list[int]) -> list[int]:
    for rc in _KECCAK_RC:
        c = [a[x] ^ a[x + 5] ^ a[x + 10] ^ a[x + 15] ^ a[x + 20] for x in range(5)]
        d = [c[(x - 1) % 5] ^ _rotl(c[(x + 1) % 5], 1) for x in range(5)]
        b = [0] * 25
        for x in range(5):
            for y in range(5):
                b[y + 5 * ((2 * x + 3 * y) % 5)] = _rotl(a[x + 5 * y] ^ d[x], _KECCAK_ROT[x][y])
        a = [b[i] ^ (~b[(i % 5 + 1) % 5 + i // 5 * 5] & b[(i % 5 + 2) % 5 + i // 5 * 5]) for i in range(25)]
        a[0] ^= rc
    return a


def keccak256(data: bytes) -> bytes:
    """Keccak-256 as Ethereum uses it (the original 0x01 padding, not SHA3-256's 0x06)."""
    rate = 136
    msg = bytearray(data) + b"\x01"
    msg += b"\0" * (-len(msg) % rate)
    msg[-1] |= 0x80
    state = [0] * 25
    for off in range(0, len(msg), rate):
        for i in range(rate // 8):
            state[i] ^= int.from_bytes(msg[off + 8 * i : off + 8 * i + 8], "little")
        state = _keccak_f(state)
    return b"".join(state[i].to_bytes(8, "little") for i in range(4))


def _eip55_ok(hex40: str) -> bool:
    digest = keccak256(hex40.lower().encode()).hex()
    return all(c.isdigit() or (c.isupper() == (int(h, 16) >= 8)) for c, h in zip(hex40, digest))


def _seed_checksum_ok(indexes: list[int]) -> bool:
    bits = 0
    for i in indexes:
        bits = bits << 11 | i
    n = len(indexes) * 11
    cs = n // 33
    entropy = (bits >> cs).to_bytes((n - cs) // 8, "big")
    return hashlib.sha256(entropy).digest()[0] >> (8 - cs) == bits & ((1 << cs) - 1)


_GAP_DIGITS: Final = re.compile(r"[0-9]+")


def _seed_words(s: str, streak: list[tuple[int, int, int, str]]) -> bool:
    """Whether a whole run of wordlist words whose checksum fails is still written as a seed phrase
    (round 8, es-wallet-seed): exactly 12, 15, 18, 21 or 24 words, at most one repeated, and the
    same separator between every two (a space, `, `, `+`, a numbering: digits read as one). A
    phrase someone invented, or mistyped, is sent as a seed all the same; prose has other words."""
    n = len(streak)
    if n not in _SEED_LENGTHS or len({w[0] for w in streak}) < n - 1:
        return False
    gaps = {_GAP_DIGITS.sub("#", s[a[2] : b[1]]) for a, b in zip(streak, streak[1:])}
    return len(gaps) == 1 or (len(gaps) == 2 and all("#" in g for g in gaps))


def _streak_hits(s: str, streak: list[tuple[int, int, int, str]], hits: list[WalletHit]) -> None:
    """Seed phrases in a run of consecutive wordlist words: (index, start, end, word) each."""
    if not any(_seed_checksum_ok([w[0] for w in streak[i : i + n]]) for n in _SEED_LENGTHS for i in range(len(streak) - n + 1)):
        if _seed_words(s, streak):
            hits.append(("seed_words", streak[0][1], streak[-1][2], f"{len(streak)} BIP-39 wordlist words written as a seed phrase, checksum invalid", ""))
        return
    i = 0
    while i + 12 <= len(streak):
        for n in _SEED_LENGTHS:
            window = streak[i : i + n]
            if len(window) == n and _seed_checksum_ok([w[0] for w in window]):
                phrase = " ".join(w[3] for w in window)
                kind, what = ("example_secret", "BIP-39 test mnemonic") if phrase in EXAMPLE_SEEDS else ("seed_phrase", "BIP-39 seed phrase")
                hits.append((kind, window[0][1], window[-1][2], f"{what}, {n} words, checksum valid", ""))
                i += n - 1
                break
        i += 1


def _seed_hits(s: str, hits: list[WalletHit]) -> None:
    """Runs of 12+ wordlist words (one pass, a set lookup per word), then their checksum windows."""
    words = bip39_words()
    for run in _WORD_RUN.finditer(s):
        indexes = [words.get(w) for w in _WORD.findall(run.group())]
        streak = 0
        for index in indexes:
            streak = streak + 1 if index is not None else 0
            if streak == 12:
                break
        if streak < 12:
            continue
        streak_words: list[tuple[int, int, int, str]] = []
        for index, m in zip(indexes, _WORD.finditer(s, run.start(), run.end())):
            if index is not None:
                streak_words.append((index, m.start(), m.end(), m.group()))
                continue
            if len(streak_words) >= 12:
                _streak_hits(s, streak_words, hits)
            streak_words = []
        if len(streak_words) >= 12:
            _streak_hits(s, streak_words, hits)


#: A verb that makes the address after it the destination of a payment (round 8,
#: bn-public-wallet-address): send, transfer, pay, sweep, move, wire, deposit, withdraw, forward,
#: remit, and the same in French, German, Spanish, Italian, Portuguese, Russian, Chinese, Japanese.
_PAY_VERB: Final = re.compile(
    r"(?i)(?<![a-z])(?:send|sent|transfer|pay|sweep|move|wire|deposit|withdraw|forward|remit|top[ -]?up"
    r"|envo[iy]|vire[rz]?|virement|transf[eé]r|[üu]berweis|sende|zahl|envi[aeé]|pag[aeu]|invi[ai]|trasferi|versa"
    r"|переве|отправ|перечисл|пересл)|转账|转到|汇款|打款|支付|付款|送金|振込|送って"
)
_PAY_REACH: Final = 80  # characters before an address where its payment verb may stand


def _payment_destinations(s: str, hits: list[WalletHit]) -> None:
    """Mark each wallet address that a payment verb stands before (within `_PAY_REACH`, no line
    break between): "move the funds to bc1…", "Überweise an 0x…", `/withdraw?address=…`. An address
    only published ("Donate: bc1…", a README) is not a payment to make."""
    for k, (kind, a, b, detail, excerpt) in enumerate(hits):
        if kind == "wallet_address":
            line = s.rfind("\n", 0, a) + 1
            if _PAY_VERB.search(s, max(line, a - _PAY_REACH), a) is not None:
                hits[k] = (kind, a, b, detail + ", named as a payment destination", excerpt)


def wallet_hits(s: str) -> list[WalletHit]:
    """Seed phrases, WIF keys and wallet addresses in one string, each checksum-verified."""
    hits: list[WalletHit] = []
    if len(s) >= 25:
        for m in _B58_RUN.finditer(s):
            text = m.group()
            n, first = len(text), text[0]
            if (n == 51 and first == "5") or (n == 52 and first in "KL"):
                payload = b58check_decode(text)
                if payload and payload[0] == 0x80 and (len(payload) == 33 or (len(payload) == 34 and payload[-1] == 1)):
                    compressed = "compressed" if len(payload) == 34 else "uncompressed"
                    if text in _EXAMPLE_WIF:
                        hits.append(("example_secret", m.start(), m.end(), "the Bitcoin wiki's example WIF key", ""))
                    else:
                        hits.append(("wif_key", m.start(), m.end(), f"WIF private key ({compressed}), checksum valid", ""))
            elif n <= 34 and first in "13":
                payload = b58check_decode(text)
                if payload and len(payload) == 21 and payload[0] in (0x00, 0x05):
                    what = "P2PKH" if payload[0] == 0 else "P2SH"
                    hits.append(("wallet_address", m.start(), m.end(), f"Bitcoin {what} address, checksum valid", text))
    if "bc1" in s or "BC1" in s:
        for m in _BECH32.finditer(s):
            what = _segwit_address(m.group())
            if what is not None:
                hits.append(("wallet_address", m.start(), m.end(), f"Bitcoin {what} address, checksum valid", m.group()))
    if "0x" in s:
        for m in _ETH.finditer(s):
            hex40 = m.group()[2:]
            if hex40.islower() or hex40.isupper() or hex40.isdigit():
                hits.append(("wallet_address", m.start(), m.end(), "Ethereum address (no EIP-55 checksum)", m.group()))
            elif _eip55_ok(hex40):
                hits.append(("wallet_address", m.start(), m.end(), "Ethereum address, EIP-55 checksum valid", m.group()))
    if hits:
        _payment_destinations(s, hits)
    if len(s) >= 55 and len(s) - len(s.translate(_NO_DIGITS)) >= 4:  # a WIF key holds ~8 digits, a hex key ~40
        _gapped_key_hits(s, hits)
    if len(s) >= 47:  # twelve 3-letter words and their separators
        _seed_hits(s, hits)
    if len(s) >= 64:
        _raw_key_hits(s, hits)
    if len(s) >= 100 and ("prv" in s or "tpv" in s or "gpv" in s):
        _extended_key_hits(s, hits)
    return hits


# ---- keys written in groups (round 6, es-wallet-private-key) ---------------------------------

#: A base58 run starting like a WIF key (5, K, L) followed by more runs with short separators
#: between them (`L4Yn7-pmheL-…`, groups of four on a line, a line per piece).
_B58_GROUPS: Final = re.compile(
    r"[5KL](?<![1-9A-HJ-NP-Za-km-z][5KL])[1-9A-HJ-NP-Za-km-z]{1,25}(?:[-\s.:_|,/]{1,3}[1-9A-HJ-NP-Za-km-z]{2,26}){1,25}"
)
_NO_DIGITS: Final = str.maketrans("", "", "0123456789")
_B58_CHUNK: Final = re.compile(r"[1-9A-HJ-NP-Za-km-z]+")
#: 64 hex digits in groups (`4c:08:83…`, `0x 4c0883a6 9102937d …`).
_HEX_GROUPS: Final = re.compile(r"(?<![0-9A-Za-z])(?:0x\s?)?(?:[0-9a-fA-F]{2,16}[\s:\-_.]{1,2}){3,31}[0-9a-fA-F]{2,16}(?![0-9A-Za-z])")


def _gapped_key_hits(s: str, hits: list[WalletHit]) -> None:
    """WIF keys and 64-hex private keys cut into groups by separators: the groups joined must
    pass the same test as a whole key (Base58Check; a key word before the hex, no digest word)."""
    for m in _B58_GROUPS.finditer(s, 0, 65_536):
        if not any(ch.isdigit() for ch in m.group()):  # 51 random base58 characters hold a digit (all but 1 in 5,000)
            continue
        chunks = [(c.start(), c.group()) for c in _B58_CHUNK.finditer(m.group())]
        for i, (start, first) in enumerate(chunks):
            if first[0] not in "5KL":
                continue
            joined = first
            for _, nxt in chunks[i + 1 :]:
                if len(joined) >= 51:
                    break
                joined += nxt
            if (len(joined) == 51 and joined[0] == "5") or (len(joined) == 52 and joined[0] in "KL"):
                payload = b58check_decode(joined)
                if payload and payload[0] == 0x80 and joined not in _EXAMPLE_WIF:
                    hits.append(("wif_key", m.start() + start, m.end(), "WIF private key written in groups, checksum valid", ""))
                    break
    if len(s) - len(s.translate(_NO_DIGITS)) < 20 or _KEY_WORDS.search(s, 0, 65_536) is None:  # a key word before it
        return
    for m in _HEX_GROUPS.finditer(s, 0, 65_536):
        digits = re.sub(r"[^0-9a-fA-F]", "", m.group().removeprefix("0x"))
        if len(digits) != 64 or digits.isdigit():
            continue
        if (hit := _hex_key(s, m.start(), m.end(), digits, "hex private key (32 bytes) written in groups")) is not None:
            hits.append(hit)


# ---- BIP-32 extended private keys (xprv, tprv, yprv, zprv, Ltpv, dgpv, ...) --------------------

_EXTENDED_HEAD: Final = re.compile(r"(?<![1-9A-HJ-NP-Za-km-z])[A-Za-z]{1,2}(?:prv|tpv|gpv)[1-9A-HJ-NP-Za-km-z]{8}")
#: BIP-32's test vector 1 master key: in the specification and every library's tests.
_EXAMPLE_XPRV: Final = frozenset({"xprv9s21ZrQH143K3QTDL4LXw2F7HEK3wJUD2nW2nRk4stbPy6cq3jPPqjiChkVvvNKmPGJxWUtg6LnF5kejMRNNU3TGtRBeJgk33yuGBxrMPHi"})
_EXTENDED_GAP: Final = frozenset(" \t\r\n\"'+,|\\")  # what may cut a key in pieces (lines, concatenation)


def _extended_key_hits(s: str, hits: list[WalletHit]) -> None:
    """BIP-32 extended private keys, any coin's version bytes: Base58Check of 78 bytes whose key
    field starts with the 0x00 that marks a private key (a public `xpub` has 02/03 there), also
    when cut by line breaks, spaces or quotes. It derives every key of the wallet."""
    for m in _EXTENDED_HEAD.finditer(s):
        chars: list[str] = []
        end = m.start()
        while end < len(s) and len(chars) < 112 and end - m.start() < 256:
            ch = s[end]
            if ch in _B58_INDEX:
                chars.append(ch)
            elif ch not in _EXTENDED_GAP:
                break
            end += 1
        for n in (111, 112):
            payload = b58check_decode("".join(chars[:n])) if len(chars) >= n else None
            if payload is not None and len(payload) == 78 and payload[45] == 0:
                if "".join(chars[:n]) in _EXAMPLE_XPRV:
                    hits.append(("example_secret", m.start(), end, "BIP-32's published test-vector master key", ""))
                    break
                cut = "" if " " not in s[m.start() : end] and "\n" not in s[m.start() : end] else ", cut in pieces"
                hits.append(("private_key", m.start(), end, f"BIP-32 extended private key ({m.group()[:4]}){cut}, checksum valid", ""))
                break


# ---- raw private keys: Ethereum (secp256k1 hex, keystore V3) and Solana (ed25519 keypairs) -----

_HEX64: Final = re.compile(r"(?<![0-9A-Za-z])(?:0x)?([0-9a-fA-F]{64})(?![0-9A-Za-z])")
#: What says a 64-hex value is a key (in the 80 characters before it) and what says it is a digest.
_KEY_WORDS: Final = re.compile(
    r"(?i)priv|secret|\bpk\b|signing[ _-]?key|wallet[ _-]?key|seed|schl[üu]ssel|cl[ée] priv|clave priv|chiave priv|chave priv|"
    r"metamask|import(?:ieren|er)?\b"
)
_DIGEST_WORDS: Final = re.compile(r"(?i)hash|sha|digest|checksum|\btx|txid|block|commit|signature|fingerprint|\bid\b|nonce|salt|\bmac\b|\biv\b|cipher")


def _hex_key(s: str, start: int, end: int, hex64: str, what: str) -> WalletHit | None:
    """A 64-hex value at `start` read as a private key when a key word is in the 80 characters before
    it and no digest word right before it (a well-known development key is an example)."""
    before = s[max(0, start - 80) : start]
    if not _KEY_WORDS.search(before) or _DIGEST_WORDS.search(before[-24:]):
        return None
    if hex64.lower() in _TEST_KEYS:
        return ("example_secret", start, end, "a well-known development key", "")
    return ("private_key", start, end, what, "")


_KEYSTORE: Final = re.compile(r'"ciphertext"\s*:\s*"[0-9a-fA-F]{32,}"')
_B58_LONG: Final = re.compile(r"(?<![1-9A-HJ-NP-Za-km-z])[1-9A-HJ-NP-Za-km-z]{85,90}(?![1-9A-HJ-NP-Za-km-z])")
_B58_PIECE: Final = re.compile(r"(?<![1-9A-HJ-NP-Za-km-z])[1-9A-HJ-NP-Za-km-z]{20,70}(?![1-9A-HJ-NP-Za-km-z])")
_BYTE_ARRAY: Final = re.compile(r"\[\s*(?:\d{1,3}\s*,\s*){63}\d{1,3}\s*\]")
#: Well-known development keys (Hardhat/Anvil default accounts): public, in every tutorial.
_TEST_KEYS: Final = frozenset(
    {"ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80",
     "59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d",
     "5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a"}
)  # fmt: skip


def is_test_key(value: str) -> bool:
    """Whether a hex private key is a well-known development key (Hardhat/Anvil defaults)."""
    return value.lower().removeprefix("0x") in _TEST_KEYS


def _raw_key_hits(s: str, hits: list[WalletHit]) -> None:
    """Private keys without a checksum of their own, each told by what stands around or inside it:
    a 64-hex value with a key word (not a digest word) just before it, an Ethereum keystore V3
    (its encrypted key, which its password opens offline), and a Solana keypair (64 bytes in base58
    or as a JSON byte array) whose second half is the ed25519 public key of its first."""
    if '"ciphertext"' in s and '"kdf' in s and (m := _KEYSTORE.search(s)) is not None:
        hits.append(("private_key", m.start(), m.end(), "Ethereum keystore (encrypted private key)", ""))
    for m in _HEX64.finditer(s):
        if (hit := _hex_key(s, m.start(), m.end(), m.group(1), "hex private key (32 bytes)")) is not None:
            hits.append(hit)
    for m in _B58_LONG.finditer(s):
        if _ed25519_keypair(b58decode(m.group())):
            hits.append(("private_key", m.start(), m.end(), "Solana keypair (base58), public half matches", ""))
    pieces = _B58_PIECE.findall(s[:8192]) if len(s) >= 90 else []
    for i in range(len(pieces) - 1):  # a keypair cut into two or three runs (lines, fields of a note)
        for j in (i + 2, i + 3):
            joined = "".join(pieces[i:j])
            if j <= len(pieces) and 85 <= len(joined) <= 90 and _ed25519_keypair(b58decode(joined)):
                hits.append(("private_key", 0, len(s), "Solana keypair (base58) cut into pieces, public half matches", ""))
                return
    if "[" in s:
        for m in _BYTE_ARRAY.finditer(s):
            values = [int(v) for v in re.findall(r"\d+", m.group())]
            if max(values) < 256 and _ed25519_keypair(bytes(values)):
                hits.append(("private_key", m.start(), m.end(), "Solana keypair (byte array), public half matches", ""))


def _ed25519_keypair(raw: bytes) -> bool:
    """Whether 64 bytes are an ed25519 seed followed by its own public key (a Solana secret key)."""
    if len(raw) != 64:
        return False
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    public = Ed25519PrivateKey.from_private_bytes(raw[:32]).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return public == raw[32:]

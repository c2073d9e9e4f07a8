"""Hosts as a connection would reach them: every spelling of an address, and what kind of place it is.

`host_facts(raw)` reads the host part of a URL the way the WHATWG URL standard (browsers,
Node's `fetch`) and the C library's `inet_aton` (curl, Python's `socket`) do, so that what the
rules see is where the backend would connect, however the address was written:

- IPv4 in decimal, hex, octal and short forms (`2130706433`, `0x7f000001`, `0177.0.0.1`, `127.1`,
  `0x7f.1`), percent-escaped hosts, Unicode full-width and ideographic dots, full-width digits and
  circled letters (NFKC), a trailing dot;
- IPv6 with brackets, zone ids (`%25eth0`), and the IPv4 address inside IPv4-mapped, -compatible,
  NAT64 (`64:ff9b::/96`) and 6to4 addresses;
- IDNA: Unicode labels to punycode, and `xn--` labels that only disguise ASCII back to it;
- names: `localhost` and `*.localhost`, single-label names and internal suffixes (`.internal`,
  `.local`, `.lan`, `.corp`, `.svc`, ...), the cloud metadata names, public wildcard DNS services that
  answer with the address written in the name (`127.0.0.1.nip.io`, `10-0-0-1.sslip.io`,
  `7f000001.nip.io`) or with loopback (`localtest.me`), DNS-rebinding services, and any name whose
  labels spell a dotted or dashed IPv4 address (`10.0.0.5.example.com`, `ip-10-0-0-5.example`).

No DNS: a public-looking name is public here, whatever it resolves to (docs/detection.md, "Egress").
Pure functions; the tables and regexes are built at import; answers are memoised per host.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote_to_bytes

from gateway.memo import Memo

__all__ = ["CLASSES", "HostFacts", "host_facts", "parse_ipv4"]

#: The classes a host can have, most severe first (`HostFacts.kind` is the first that applies).
CLASSES: Final = ("metadata", "loopback", "unspecified", "rebinding", "link_local", "private", "internal_name",
                  "multicast", "reserved")

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address

_METADATA_IPS: Final = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, Oracle, DigitalOcean, OpenStack, Hetzner ... instance metadata
    "169.254.170.2",    # AWS ECS task metadata and credentials
    "169.254.170.23",   # AWS EKS pod identity agent
    "fd00:ec2::254",    # AWS instance metadata over IPv6
    "fd00:ec2::23",     # AWS EKS pod identity agent over IPv6
    "100.100.100.200",  # Alibaba Cloud
    "192.0.0.192",      # Oracle Cloud (classic)
    "168.63.129.16",    # Azure WireServer (a public address only the VM's host answers)
))  # fmt: skip
_METADATA_NAMES: Final = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data", "instance-data.ec2.internal",
    "metadata.azure.com", "metadata.azure.internal", "metadata.oraclecloud.com", "metadata.digitalocean.com",
    "metadata.tencentyun.com", "metadata.packet.net", "metadata.platformequinix.com",
    "api.metadata.cloud.ibm.com", "metadata.ec2.internal",
})  # fmt: skip
_LOOPBACK_NAMES: Final = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
#: Public names (and every name under them) whose DNS answers 127.0.0.1.
_LOOPBACK_DOMAINS: Final = ("localhost", "localtest.me", "lvh.me", "vcap.me", "localho.st", "lacolhost.com")
#: Wildcard DNS services answering with the address the labels spell (dotted, dashed or 8 hex digits).
_ECHO_DOMAINS: Final = ("nip.io", "sslip.io", "xip.io", "traefik.me", "nip.direct", "backname.io")
#: DNS-rebinding services: a name that answers a public address first, then an internal one.
_REBINDING_DOMAINS: Final = ("rbndr.us", "1u.ms", "rebind.network", "rebind.it", "lock.cmpxchg8b.com")
#: Suffixes only an internal resolver answers (RFC 6761/6762/8375, ICANN's `.internal`, and common practice).
_INTERNAL_SUFFIXES: Final = ("local", "localdomain", "internal", "intranet", "lan", "home", "home.arpa", "corp",
                             "private", "svc", "cluster.local", "default", "consul")

_NETWORKS: Final = {
    "loopback": ("127.0.0.0/8", "::1/128"),
    "unspecified": ("0.0.0.0/32", "::/128"),
    "link_local": ("169.254.0.0/16", "fe80::/10"),
    "private": ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7", "fec0::/10"),
    "multicast": ("224.0.0.0/4", "ff00::/8"),
}
_NETS: Final = {cls: tuple(ipaddress.ip_network(n) for n in nets) for cls, nets in _NETWORKS.items()}
#: Documentation ranges (RFC 5737, RFC 3849, RFC 9637): tutorials and test fixtures write public hosts with
#: them, and no network routes them, so they are no class of their own (a request there goes nowhere).
_DOCUMENTATION: Final = tuple(ipaddress.ip_network(n) for n in (
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32", "3fff::/20"))
_NAT64: Final = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))

_DOTS: Final = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})
_FORBIDDEN: Final = re.compile(r"[\x00-\x20#%/:<>?@\[\\\]^|\x7f]")
_DEC: Final = re.compile(r"[0-9]+\Z")
_HEX_NUMBER: Final = re.compile(r"0[xX][0-9A-Fa-f]*\Z")
_DASHED_V4: Final = re.compile(r"(?<![0-9a-z])([0-9]{1,3})-([0-9]{1,3})-([0-9]{1,3})-([0-9]{1,3})(?![0-9])")
_HEX8: Final = re.compile(r"(?:^|[.-])([0-9a-f]{8})(?=$|[.-])")


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What a host is: its normal form, the address it is or spells, and its classes.

    `name` is the host as a resolver would be asked (lower case, ASCII/punycode, no trailing dot;
    an IP in its canonical form, IPv6 without brackets or zone); `ip` the address the host is or
    spells (for an IPv6 address that carries an IPv4 one, the IPv4 one), "" for a plain name;
    `invalid` why no client would accept it ("" when it parses); `obfuscated` that it was not
    written in the canonical form (a numeric IPv4 form, percent-escapes, non-ASCII dots or letters).
    """

    name: str
    ip: str = ""
    version: int = 0
    classes: frozenset[str] = frozenset()
    invalid: str = ""
    idna: bool = False
    trailing_dot: bool = False
    zone: str = ""
    obfuscated: bool = False

    @property
    def kind(self) -> str:
        """The most severe class, "invalid", or "public"."""
        if self.invalid:
            return "invalid"
        return next((c for c in CLASSES if c in self.classes), "public")


_FACTS: Memo[str, HostFacts] = Memo(4096)


def host_facts(raw: str) -> HostFacts:
    """The facts of the host part of a URL as written (without userinfo and port).

    Percent-escapes are decoded and IPv4 numbers in any form are addresses, whatever the scheme:
    WHATWG does so for the special schemes, and a client that hands a non-special URL's host to
    the resolver (curl's `gopher://2130706433/`) reaches the same address.
    """
    hit = _FACTS.get(raw)
    if hit is None:
        hit = _FACTS.remember(raw, _host_facts(raw))
    return hit


def _host_facts(raw: str) -> HostFacts:
    text = raw
    obfuscated = False
    if "%" in text:
        if text.startswith("["):
            text = text.replace("%25", "%")  # a zone id's escaped `%`
        else:
            try:
                text = unquote_to_bytes(text).decode("utf-8")
            except UnicodeDecodeError:
                return HostFacts(raw.lower(), invalid="percent-escapes that are not UTF-8")
            obfuscated = True
    if text.startswith("["):
        return _bracketed(text, raw)
    if not text:
        return HostFacts("", invalid="empty host")
    domain, idna, disguised, problem = _to_ascii(text)
    if problem:
        return HostFacts(raw.lower(), invalid=problem)
    obfuscated = obfuscated or disguised or not text.isascii()
    trailing = domain.endswith(".")
    if trailing:
        domain = domain[:-1]
    if _ends_in_number(domain):
        ip = parse_ipv4(domain)
        if ip is None:
            return HostFacts(domain, invalid="a number that is not an IPv4 address", trailing_dot=trailing)
        canonical = str(ip)
        return _address(ip, canonical, obfuscated or canonical != domain, trailing)
    if ":" in domain and _looks_ipv6(domain):  # a bare IPv6 address (scheme-less `host` fields)
        return _bracketed(f"[{domain}]", raw)
    if _FORBIDDEN.search(domain) or not domain or ".." in domain or domain.startswith("."):
        return HostFacts(domain, invalid="characters no host name may hold", idna=idna, trailing_dot=trailing)
    return _name(domain, idna, trailing, obfuscated)


def _to_ascii(text: str) -> tuple[str, bool, bool, str]:
    """UTS 46 in short: NFKC, lower case, the four dots, punycode. Returns (domain, idna, disguised, problem)."""
    idna = disguised = False
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    text = text.translate(_DOTS).lower()
    labels = text.split(".")
    out: list[str] = []
    for label in labels:
        if label.startswith("xn--"):
            try:
                decoded = label[4:].encode("ascii").decode("punycode")
            except (UnicodeError, ValueError):
                return text, True, False, "an xn-- label that is not punycode"
            folded = unicodedata.normalize("NFKC", decoded).translate(_DOTS).lower()
            if folded.isascii():  # an "IDN" that is only ASCII in disguise
                out.extend(folded.split("."))
                disguised = True
                continue
            idna = True
        elif not label.isascii():
            idna = True
            try:
                label = "xn--" + label.encode("punycode").decode("ascii")
            except UnicodeError:
                return text, True, False, "a label that does not encode to punycode"
        out.append(label)
    return ".".join(out), idna, disguised, ""


def _ends_in_number(domain: str) -> bool:
    last = domain.rsplit(".", 1)[-1]
    return bool(last) and (_DEC.match(last) is not None or _HEX_NUMBER.match(last) is not None)


def parse_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """IPv4 as WHATWG and `inet_aton` read it: 1-4 parts, each decimal, `0x` hex or `0` octal; the last
    part fills the remaining bytes (`127.1`, `2130706433`). None when it is not such an address."""
    parts = text.split(".")
    if len(parts) > 4 or any(not p for p in parts):
        return None
    numbers: list[int] = []
    for part in parts:
        try:
            if part[:2] in ("0x", "0X"):
                numbers.append(int(part[2:], 16) if len(part) > 2 else 0)
            elif len(part) > 1 and part[0] == "0":
                numbers.append(int(part, 8))
            else:
                numbers.append(int(part, 10))
        except ValueError:
            return None
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        return None
    value = last
    for i, n in enumerate(head):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def _looks_ipv6(text: str) -> bool:
    return text.count(":") >= 2 and re.fullmatch(r"[0-9a-f:.]+(?:%.+)?", text) is not None


def _bracketed(text: str, raw: str) -> HostFacts:
    inner = text[1:-1] if text.endswith("]") else None
    if inner is None:
        return HostFacts(raw.lower(), invalid="an IPv6 address without its closing bracket")
    address, _, zone = inner.partition("%")
    try:
        ip = ipaddress.IPv6Address(address)
    except ValueError:
        return HostFacts(raw.lower(), invalid="not an IPv6 address")
    facts = _address(ip, ip.compressed, address.lower() != ip.compressed, False)
    if zone:
        return HostFacts(facts.name, facts.ip, facts.version, facts.classes, zone=zone, obfuscated=True)
    return facts


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries to the IPv4 network (mapped, compatible, NAT64, 6to4)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    value = int(ip)
    if value >> 32 == 0 and value > 1:  # IPv4-compatible ::a.b.c.d (deprecated, still parsed)
        return ipaddress.IPv4Address(value)
    if any(ip in net for net in _NAT64):
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    return ip.sixtofour


def _address(ip: _IP, name: str, obfuscated: bool, trailing: bool) -> HostFacts:
    classes = set(ip_classes(ip))
    spelled: _IP = ip
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_v4(ip)
        if inner is not None:
            classes = set(ip_classes(inner))  # the packet goes to the IPv4 address
            spelled = inner
    return HostFacts(name, str(spelled), spelled.version, frozenset(classes), trailing_dot=trailing,
                     obfuscated=obfuscated)


def ip_classes(ip: _IP) -> frozenset[str]:
    """The classes of one address (`CLASSES`); empty for a public unicast address."""
    found = {cls for cls, nets in _NETS.items() if any(ip in net for net in nets)}
    if ip in _METADATA_IPS:
        found.add("metadata")
    if not found and not ip.is_global and not any(ip in net for net in _DOCUMENTATION):
        found.add("reserved")  # documentation, benchmarking, 0/8, 240/4, broadcast, IETF ranges
    return frozenset(found)


def _under(name: str, domains: tuple[str, ...]) -> str | None:
    """The domain of `domains` that `name` is or is under, if any."""
    return next((d for d in domains if name == d or name.endswith("." + d)), None)


def _name(name: str, idna: bool, trailing: bool, obfuscated: bool) -> HostFacts:
    classes: set[str] = set()
    spelled = _spelled_ipv4(name)
    if name in _METADATA_NAMES or (name.split(".", 1)[0] in ("metadata", "instance-data")
                                   and ("." not in name or _under(name, _INTERNAL_SUFFIXES))):
        classes.add("metadata")
    if name in _LOOPBACK_NAMES or _under(name, _LOOPBACK_DOMAINS):
        classes.add("loopback")
    if _under(name, _REBINDING_DOMAINS):
        classes.add("rebinding")
    if "." not in name or _under(name, _INTERNAL_SUFFIXES):
        classes.add("internal_name")
    if spelled is not None:
        classes |= ip_classes(spelled)
    return HostFacts(name, str(spelled) if spelled is not None else "", spelled.version if spelled else 0,
                     frozenset(classes), idna=idna, trailing_dot=trailing, obfuscated=obfuscated)


def _spelled_ipv4(name: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a name's labels spell: four decimal labels in a row, a dashed `a-b-c-d`, or
    (under a wildcard-echo or rebinding service) 8 hex digits. The first non-public one wins."""
    found: list[ipaddress.IPv4Address] = []
    labels = name.split(".")
    for i in range(len(labels) - 4):  # the last label is a suffix, never part of the address
        run = labels[i:i + 4]
        if all(_DEC.match(p) and len(p) <= 3 for p in run):
            ip = parse_ipv4(".".join(str(int(p)) for p in run))
            if ip is not None:
                found.append(ip)
    for m in _DASHED_V4.finditer(name):
        if all(int(g) <= 255 for g in m.groups()):
            found.append(ipaddress.IPv4Address(".".join(str(int(g)) for g in m.groups())))
    if _under(name, _ECHO_DOMAINS) or _under(name, _REBINDING_DOMAINS):
        found.extend(ipaddress.IPv4Address(int(m.group(1), 16)) for m in _HEX8.finditer(name))
    if not found:
        return None
    return next((ip for ip in found if ip_classes(ip)), found[0])

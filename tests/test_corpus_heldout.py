"""The held-out detection corpora (tests/corpus_heldout*/README.md) checked as data only: each loads
with the tuned corpus's loader, meets its sizes, keeps its ids apart from the tuned corpus and the
other held-out corpora, gives every case one class, and is byte-for-byte its frozen version
(MANIFEST.sha256).

Nothing here runs a case through the gateway (bench/detection.py measures them), and nothing here
prints a held-out corpus's ids: the corpora are only loaded to compare id sets and count cases.
"""

from __future__ import annotations

import collections
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.corpus.model import CASES as TUNED_CASES
from tests.corpus.model import load_cases

HERE = Path(__file__).resolve().parent
ATTACK_FAMILIES = ("tool_poisoning", "injected_results", "obfuscated_shell", "encoded_secrets", "exfil_chains",
                   "ssrf", "url_exfil", "fetched_injection")
PREFIX = {"tool_poisoning": "tp", "injected_results": "ir", "obfuscated_shell": "os", "encoded_secrets": "es",
          "exfil_chains": "ec", "ssrf": "ss", "url_exfil": "ux", "fetched_injection": "fi", "benign": "bn"}


@dataclass(frozen=True)
class HeldOut:
    """One frozen corpus and the sizes it was written to (its README says why)."""

    folder: str
    id_prefix: str
    min_attacks: dict[str, int]
    min_benign: int
    min_benign_per_family: int
    benign_classes_prefixed: bool = False

    @property
    def root(self) -> Path:
        return HERE / self.folder


#: The sizes every held-out corpus since the sixth keeps: >= 25 attacks per family (30 for the three
#: text families), >= 100 benign with >= 10 looking like each family.
SIXTH_SIZES: dict = {
    "min_attacks": {f: 25 for f in ATTACK_FAMILIES} | {"tool_poisoning": 30, "injected_results": 30, "fetched_injection": 30},
    "min_benign": 100, "min_benign_per_family": 10, "benign_classes_prefixed": True,
}

CORPORA = (
    # The first: issue 24's five families (>= 12 attacks each) and issue 27's three (>= 20 each).
    HeldOut("corpus_heldout", "ho", {f: 12 for f in ATTACK_FAMILIES[:5]} | {f: 20 for f in ATTACK_FAMILIES[5:]},
            min_benign=65, min_benign_per_family=1),
    HeldOut("corpus_heldout2", "h2", {f: 15 for f in ATTACK_FAMILIES} | {"obfuscated_shell": 25, "ssrf": 25},
            min_benign=80, min_benign_per_family=6),
    HeldOut("corpus_heldout3", "h3", {f: 12 for f in ATTACK_FAMILIES} | {"obfuscated_shell": 16, "ssrf": 16},
            min_benign=64, min_benign_per_family=6, benign_classes_prefixed=True),
    # The fourth, frozen 2026-11-29: >= 15 attacks per family (20 for obfuscated_shell and ssrf), >= 80
    # benign with >= 8 looking like each family.
    HeldOut("corpus_heldout4", "h4", {f: 15 for f in ATTACK_FAMILIES} | {"obfuscated_shell": 20, "ssrf": 20},
            min_benign=80, min_benign_per_family=8, benign_classes_prefixed=True),
    # The fifth, frozen 2026-11-29: >= 20 attacks per family (25 for obfuscated_shell), >= 100 benign with
    # >= 10 looking like each family.
    HeldOut("corpus_heldout5", "h5", {f: 20 for f in ATTACK_FAMILIES} | {"obfuscated_shell": 25},
            min_benign=100, min_benign_per_family=10, benign_classes_prefixed=True),
    # The sixth, frozen 2026-11-29: a third of its text attacks adapted from public datasets.
    HeldOut("corpus_heldout6", "h6", **SIXTH_SIZES),
    # The seventh, frozen 2026-11-29: at least half of the tool_poisoning, injected_results
    # and fetched_injection attacks adapted from public datasets (other sources than the sixth's).
    HeldOut("corpus_heldout7", "h7", **SIXTH_SIZES),
    # The eighth, frozen 2026-11-29: at least half of the tool_poisoning, injected_results
    # and fetched_injection attacks adapted from public sources none of the earlier corpora used.
    HeldOut("corpus_heldout8", "h8", **SIXTH_SIZES),
    # The ninth, frozen 2026-11-29: at least half of the tool_poisoning, injected_results
    # and fetched_injection attacks adapted from public sources none of the earlier corpora used.
    HeldOut("corpus_heldout9", "h9", **SIXTH_SIZES),
    # The tenth, frozen 2026-11-29: at least half of the tool_poisoning, injected_results
    # and fetched_injection attacks adapted from public sources none of the earlier corpora used.
    HeldOut("corpus_heldout10", "h10", **SIXTH_SIZES),
    # The eleventh, frozen 2026-11-29: at least half of the tool_poisoning, injected_results
    # and fetched_injection attacks adapted from public sources none of the earlier corpora used.
    HeldOut("corpus_heldout11", "h11", **SIXTH_SIZES),
)
IDS = [c.folder for c in CORPORA]


@pytest.fixture(scope="module", params=CORPORA, ids=IDS)
def corpus(request: pytest.FixtureRequest) -> tuple[HeldOut, list]:
    spec: HeldOut = request.param
    return spec, load_cases(spec.root / "cases")


def test_each_heldout_corpus_meets_its_sizes(corpus) -> None:
    spec, cases = corpus
    attacks = collections.Counter(c.family for c in cases if c.family != "benign")
    for family, minimum in spec.min_attacks.items():
        assert attacks[family] >= minimum, f"{spec.folder} {family}: {attacks[family]} attack cases, want {minimum}"
    benign = [c for c in cases if c.family == "benign"]
    assert len(benign) >= spec.min_benign, f"{spec.folder}: {len(benign)} benign cases, want {spec.min_benign}"
    looks = collections.Counter(c.looks_like for c in benign)
    for family in ATTACK_FAMILIES:
        assert looks[family] >= spec.min_benign_per_family, f"{spec.folder}: benign looking like {family}: {looks[family]}"


def test_ids_are_prefixed_and_apart_from_every_other_corpus(corpus) -> None:
    spec, cases = corpus
    for case in cases:
        assert case.id.startswith(f"{spec.id_prefix}-{PREFIX[case.family]}-"), (spec.folder, case.id)
        assert Path(case.file).name == f"{case.family}.json", (spec.folder, case.id, case.file)
    mine = {c.id for c in cases}
    others = [TUNED_CASES] + [o.root / "cases" for o in CORPORA if o is not spec]
    for folder in others:
        shared = mine & {c.id for c in load_cases(folder)}
        assert not shared, f"{len(shared)} ids of {spec.folder} also in {folder.parent.name}"


def test_every_case_has_one_class(corpus) -> None:
    spec, cases = corpus
    classes = json.loads((spec.root / "classes.json").read_text(encoding="utf-8"))
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids), spec.folder
    assert set(classes) == set(ids), f"{spec.folder}: {len(set(classes) ^ set(ids))} ids without a class or case"
    assert all(isinstance(v, str) and v for v in classes.values())
    if spec.benign_classes_prefixed:
        assert all(classes[c.id].startswith("bn-") for c in cases if c.family == "benign"), spec.folder


@pytest.mark.parametrize("spec", CORPORA, ids=IDS)
def test_the_files_are_the_frozen_ones(spec: HeldOut) -> None:
    """Any edit to a frozen file shows here: a corpus is changed only by a new freeze, said so in its
    README.md (never to make a detector's miss go away)."""
    manifest = {}
    for line in (spec.root / "MANIFEST.sha256").read_text(encoding="utf-8").splitlines():
        digest, name = line.split(maxsplit=1)
        manifest[name.strip()] = digest
    present = {str(p.relative_to(spec.root)) for p in (spec.root / "cases").glob("*.json")} | {"classes.json"}
    assert set(manifest) == present, f"{spec.folder}: manifest lists {sorted(manifest)}, files are {sorted(present)}"
    for name, digest in manifest.items():
        actual = hashlib.sha256((spec.root / name).read_bytes()).hexdigest()
        assert actual == digest, f"{spec.folder}/{name} changed since the freeze"

"""The third held-out detection corpus (tests/corpus_heldout3/README.md) checked as data only: it
loads with the tuned corpus's loader, meets its sizes, keeps its ids apart from the tuned corpus and
both earlier held-out corpora, gives every case one class, and is byte-for-byte the frozen version
(MANIFEST.sha256).

Nothing here runs a case through the gateway, and nothing here prints another corpus's ids: the
other corpora are only loaded to compare id sets.
"""

from __future__ import annotations

import collections
import hashlib
import json
from pathlib import Path

from tests.corpus.model import CASES as TUNED_CASES
from tests.corpus.model import load_cases

HERE = Path(__file__).resolve().parent
HELDOUT3 = HERE / "corpus_heldout3"
FIRST_HELDOUT_CASES = HERE / "corpus_heldout" / "cases"
SECOND_HELDOUT_CASES = HERE / "corpus_heldout2" / "cases"
CASES = load_cases(HELDOUT3 / "cases")
CLASSES = json.loads((HELDOUT3 / "classes.json").read_text(encoding="utf-8"))

ATTACK_FAMILIES = ("tool_poisoning", "injected_results", "obfuscated_shell", "encoded_secrets", "exfil_chains",
                   "ssrf", "url_exfil", "fetched_injection")
MIN_ATTACKS = {family: 12 for family in ATTACK_FAMILIES} | {"obfuscated_shell": 16, "ssrf": 16}
MIN_BENIGN = 64
MIN_BENIGN_PER_LOOKS_LIKE = 6
PREFIX = {"tool_poisoning": "tp", "injected_results": "ir", "obfuscated_shell": "os", "encoded_secrets": "es",
          "exfil_chains": "ec", "ssrf": "ss", "url_exfil": "ux", "fetched_injection": "fi", "benign": "bn"}


def test_the_third_heldout_corpus_meets_its_sizes() -> None:
    attacks = collections.Counter(c.family for c in CASES if c.family != "benign")
    for family, minimum in MIN_ATTACKS.items():
        assert attacks[family] >= minimum, f"{family}: {attacks[family]} attack cases, want {minimum}"
    benign = [c for c in CASES if c.family == "benign"]
    assert len(benign) >= MIN_BENIGN, f"{len(benign)} benign cases, want {MIN_BENIGN}"
    looks = collections.Counter(c.looks_like for c in benign)
    for family in ATTACK_FAMILIES:
        assert looks[family] >= MIN_BENIGN_PER_LOOKS_LIKE, f"benign looking like {family}: {looks[family]}"


def test_ids_are_prefixed_and_apart_from_the_other_corpora() -> None:
    for case in CASES:
        assert case.id.startswith(f"h3-{PREFIX[case.family]}-"), case.id
        assert Path(case.file).name == f"{case.family}.json", (case.id, case.file)
    mine = {c.id for c in CASES}
    for folder in (TUNED_CASES, FIRST_HELDOUT_CASES, SECOND_HELDOUT_CASES):
        others = {c.id for c in load_cases(folder)}
        shared = mine & others
        assert not shared, f"{len(shared)} ids of this corpus also in {folder.parent.name}"


def test_every_case_has_one_class() -> None:
    ids = [c.id for c in CASES]
    assert len(set(ids)) == len(ids)
    assert set(CLASSES) == set(ids), sorted(set(CLASSES) ^ set(ids))
    assert all(isinstance(v, str) and v for v in CLASSES.values())
    for case in CASES:
        if case.family == "benign":
            assert CLASSES[case.id].startswith("bn-"), (case.id, CLASSES[case.id])


def test_the_files_are_the_frozen_ones() -> None:
    """Any edit to a frozen file shows here: the corpus is changed only by a new freeze, said so
    in README.md (never to make a detector's miss go away)."""
    manifest = {}
    for line in (HELDOUT3 / "MANIFEST.sha256").read_text(encoding="utf-8").splitlines():
        digest, name = line.split(maxsplit=1)
        manifest[name.strip()] = digest
    present = {str(p.relative_to(HELDOUT3)) for p in (HELDOUT3 / "cases").glob("*.json")} | {"classes.json"}
    assert set(manifest) == present, f"manifest lists {sorted(manifest)}, files are {sorted(present)}"
    for name, digest in manifest.items():
        actual = hashlib.sha256((HELDOUT3 / name).read_bytes()).hexdigest()
        assert actual == digest, f"{name} changed since the freeze"

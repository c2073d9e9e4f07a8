"""The held-out detection corpus (tests/corpus_heldout/README.md) checked as data only: it loads
with the tuned corpus's loader, meets the sizes issues 24 and 27 ask for, keeps its ids apart from
the tuned corpus's, and is byte-for-byte the frozen version (MANIFEST.sha256).

Nothing here runs a case through the gateway: the held-out figures are measured by the runner,
wired separately, and no detector is tuned to this file's cases.
"""

from __future__ import annotations

import collections
import hashlib
import json
from pathlib import Path

from tests.corpus.model import CASES as TUNED_CASES
from tests.corpus.model import load_cases

HELDOUT = Path(__file__).resolve().parent / "corpus_heldout"
CASES = load_cases(HELDOUT / "cases")
CLASSES = json.loads((HELDOUT / "classes.json").read_text(encoding="utf-8"))

ISSUE24_FAMILIES = ("tool_poisoning", "injected_results", "obfuscated_shell", "encoded_secrets", "exfil_chains")
ISSUE27_FAMILIES = ("ssrf", "url_exfil", "fetched_injection")
PREFIX = {"tool_poisoning": "tp", "injected_results": "ir", "obfuscated_shell": "os", "encoded_secrets": "es",
          "exfil_chains": "ec", "ssrf": "ss", "url_exfil": "ux", "fetched_injection": "fi", "benign": "bn"}


def _area(case) -> str:
    """The issue a case counts for: its own family, or for a benign case the family it looks like."""
    family = case.looks_like if case.family == "benign" else case.family
    return "24" if family in ISSUE24_FAMILIES else "27"


def test_the_heldout_corpus_meets_its_sizes() -> None:
    attacks = collections.Counter(c.family for c in CASES if c.family != "benign")
    benign = collections.Counter(_area(c) for c in CASES if c.family == "benign")
    for family in ISSUE24_FAMILIES:
        assert attacks[family] >= 12, f"{family}: {attacks[family]} attack cases"
    issue24 = sum(attacks[f] for f in ISSUE24_FAMILIES) + benign["24"]
    assert issue24 >= 120, f"issue 24: {issue24} cases"
    assert benign["24"] >= 40, f"issue 24: {benign['24']} benign cases"
    for family in ISSUE27_FAMILIES:
        assert attacks[family] >= 20, f"{family}: {attacks[family]} attack cases"
    assert benign["27"] >= 25, f"issue 27: {benign['27']} benign cases"
    looks = {c.looks_like for c in CASES if c.family == "benign"}
    assert looks == set(ISSUE24_FAMILIES + ISSUE27_FAMILIES), f"benign look-alikes cover {sorted(looks)}"


def test_ids_are_prefixed_and_apart_from_the_tuned_corpus() -> None:
    for case in CASES:
        assert case.id.startswith(f"ho-{PREFIX[case.family]}-"), case.id
        assert Path(case.file).name == f"{case.family}.json", (case.id, case.file)
    tuned = {c.id for c in load_cases(TUNED_CASES)}
    shared = tuned & {c.id for c in CASES}
    assert not shared, f"ids also in the tuned corpus: {sorted(shared)}"


def test_every_case_has_one_class() -> None:
    ids = [c.id for c in CASES]
    assert len(set(ids)) == len(ids)
    assert set(CLASSES) == set(ids), (sorted(set(CLASSES) ^ set(ids)))
    assert all(isinstance(v, str) and v for v in CLASSES.values())


def test_the_files_are_the_frozen_ones() -> None:
    """Any edit to a frozen file shows here: the corpus is changed only by a new freeze, said so
    in README.md (never to make a detector's miss go away)."""
    manifest = {}
    for line in (HELDOUT / "MANIFEST.sha256").read_text(encoding="utf-8").splitlines():
        digest, name = line.split(maxsplit=1)
        manifest[name.strip()] = digest
    present = {str(p.relative_to(HELDOUT)) for p in (HELDOUT / "cases").glob("*.json")} | {"classes.json"}
    assert set(manifest) == present, f"manifest lists {sorted(manifest)}, files are {sorted(present)}"
    for name, digest in manifest.items():
        actual = hashlib.sha256((HELDOUT / name).read_bytes()).hexdigest()
        assert actual == digest, f"{name} changed since the freeze"

"""detection: the labelled corpora through `dharma stdio` with the standard profile.

Eleven corpora, the same harness (`tests.corpus.runner`: each case its own `dharma stdio` and SDK
server, every tool granted to the local user, the client declining every approval):
- **tuned** (tests/corpus/): the cases the detectors were built and adjusted against; the same run
  as tests/test_corpus.py. Misses are named case by case.
- **held-out 10** (tests/corpus_heldout10/): the freshest. Written by someone who read neither the
  detectors nor any other corpus's cases, over half of its text-injection attacks adapted from public
  benchmarks and scanners no earlier corpus used (its SOURCES.md), frozen 2026-11-29 before the
  eighth round of issue 24/27 detector work; read per family before and after that round.
- **held-out 9** (tests/corpus_heldout9/): written the same way, over half of its text-injection
  attacks adapted from a public technique catalogue (its SOURCES.md), frozen before the seventh
  round; read per family before and after it, its per-class misses chose the eighth round's classes.
- **held-out 8** (tests/corpus_heldout8/): written the same way after the sixth round, frozen before
  the seventh; read per family before and after the seventh round.
- **held-out 7** (tests/corpus_heldout7/): written the same way, over half of its text-injection
  attacks adapted from public sources, frozen before the sixth round; its per-class counts were read
  after that round and chose the seventh round's classes.
- **held-out 6** (tests/corpus_heldout6/): written the same way, a third of its text-injection
  attacks adapted from public datasets and payload lists, frozen before the fifth round.
- **held-out 5** (tests/corpus_heldout5/): written the same way (all by hand) before the fourth
  round; its per-class miss counts chose the fifth round's classes.
- **held-out 4** (tests/corpus_heldout4/): written the same way after the third round; its
  per-class miss counts chose the fourth round's classes.
- **held-out 3** (tests/corpus_heldout3/): written the same way after the second round; its
  per-class miss counts chose the third round's classes.
- **held-out 2** (tests/corpus_heldout2/): written the same way, frozen before the issue 24/27
  detectors landed; its per-class miss counts chose the second round's classes. Read per family
  and per class (its classes.json), never case by case (its README).
- **held-out 1** (tests/corpus_heldout/): the first held-out corpus, also frozen before the
  detectors changed, but no longer independent: the names of its missed cases were seen while
  the detectors were tuned (docs/detection.md). Reported for comparison, read like held-out 2.

Held-out 11 (tests/corpus_heldout11/) is frozen for the ninth round and not run here until that
round lands.

Per attack family: the cases caught (recall), precision against the benign look-alikes of that
family, the benign cases refused (false positives), and the cases that could not run. Targets
(issues 10 and 24): recall >= 0.9 on every family of every corpus, every benign case allowed.
`--quick` runs the first three cases of each corpus file only (a smoke test of the harness; its
figures are not the corpora's).
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Sequence
from pathlib import Path

from bench import Options, Results, Target, table
from tests.corpus.model import Case, load_cases
from tests.corpus.runner import RECALL_TARGET, REPO, Verdict, families_of, figures, fmt_ratio, run_corpus

QUICK_PER_FILE = 3
#: The held-out corpora, the clean one first: (name in the report, folder).
HELD_OUT: tuple[tuple[str, Path], ...] = (
    ("held-out 10", REPO / "tests" / "corpus_heldout10"),
    ("held-out 9", REPO / "tests" / "corpus_heldout9"),
    ("held-out 8", REPO / "tests" / "corpus_heldout8"),
    ("held-out 7", REPO / "tests" / "corpus_heldout7"),
    ("held-out 6", REPO / "tests" / "corpus_heldout6"),
    ("held-out 5", REPO / "tests" / "corpus_heldout5"),
    ("held-out 4", REPO / "tests" / "corpus_heldout4"),
    ("held-out 3", REPO / "tests" / "corpus_heldout3"),
    ("held-out 2", REPO / "tests" / "corpus_heldout2"),
    ("held-out 1, not independent", REPO / "tests" / "corpus_heldout"),
)


def sample(cases: list[Case], quick: bool) -> list[Case]:
    """Every case, or with `quick` the first QUICK_PER_FILE of each corpus file."""
    if not quick:
        return cases
    taken: collections.Counter[str] = collections.Counter()
    chosen = []
    for case in cases:
        if taken[case.file] < QUICK_PER_FILE:
            taken[case.file] += 1
            chosen.append(case)
    return chosen


async def run(opts: Options, results: Results) -> None:
    for name, folder in (("tuned", None), *HELD_OUT):
        cases = sample(load_cases() if folder is None else load_cases(folder / "cases"), opts.quick)
        started = time.perf_counter()
        verdicts = await run_corpus(cases, concurrency=4)
        seconds = time.perf_counter() - started
        scope = f"a sample of {len(cases)} cases (--quick)" if opts.quick else f"all {len(cases)} cases"
        report(name, verdicts, f"{scope} through dharma stdio (standard profile, every tool granted), 4 at a time, {seconds:.1f} s",
               results)
        if folder is None:
            for family in (*families_of(verdicts), "benign"):
                wrong = [v.case_id for v in verdicts if v.family == family and not v.ok]
                if wrong:
                    print(f"   {family} not meeting the label: {', '.join(wrong)}")
        else:
            print_classes(verdicts, json.loads((folder / "classes.json").read_text(encoding="utf-8")))


def report(name: str, verdicts: Sequence[Verdict], note: str, results: Results) -> None:
    """The per-family table of one corpus, and its targets."""
    rows = figures(verdicts)
    table(f"detection, {name} corpus", ["family", "attacks", "caught", "recall", "precision", "benign look-alikes",
                                        "refused (FP)", "errors"],
          [(r.family, r.attacks, r.caught, fmt_ratio(r.recall), fmt_ratio(r.precision), r.benign, r.false_positives, r.errors)
           for r in rows], note=note)
    label = "" if name == "tuned" else f", {name}"
    for r in rows:
        results.add(Target(f"detection recall ({r.family}{label})", r.recall if r.attacks else None, RECALL_TARGET, "of attacks",
                           higher_is_better=True, note="" if r.attacks else "no case in this run"))
    benign = [v for v in verdicts if v.family == "benign"]
    allowed = sum(v.ok for v in benign)
    results.add(Target(f"detection benign look-alikes allowed{label}", allowed / len(benign) if benign else None, 1.0,
                       "of benign cases", higher_is_better=True,
                       note=f"{len(benign) - allowed} refused" if benign else "no case in this run"))


def print_classes(verdicts: Sequence[Verdict], classes: dict[str, str]) -> None:
    """Per (family, class) of the held-out corpus: the cases and how many miss their label."""
    total: collections.Counter[tuple[str, str]] = collections.Counter()
    wrong: collections.Counter[tuple[str, str]] = collections.Counter()
    for v in verdicts:
        key = (v.family if v.family != "benign" else f"benign~{v.looks_like}", classes.get(v.case_id, "?"))
        total[key] += 1
        wrong[key] += not v.ok
    print("   held-out, per class (cases, not meeting the label):")
    for key in sorted(total):
        print(f"   {key[0]:<28} {key[1]:<34} {total[key]:>3}  {wrong[key]:>3}{'' if not wrong[key] else '  <'}")

"""detection: the labelled corpus (tests/corpus/) through `dharma stdio` with the standard profile.

The same run as tests/test_corpus.py (one `tests.corpus.runner`: each case its own `dharma stdio`
and SDK server, every tool granted to the local user, the client declining every approval),
printed as figures: per attack family the cases caught (recall), precision against the benign
look-alikes of that family, the benign cases refused (false positives), and the cases that
could not run. Targets (issue 10): recall >= 0.9 on every family, every benign case allowed.
`--quick` runs the first three cases of each corpus file only (a smoke test of the harness; its
figures are not the corpus's).
"""

from __future__ import annotations

import collections
import time

from bench import Options, Results, Target, table
from tests.corpus.model import load_cases
from tests.corpus.runner import ATTACK_FAMILIES, RECALL_TARGET, figures, fmt_ratio, run_corpus

QUICK_PER_FILE = 3


async def run(opts: Options, results: Results) -> None:
    cases = load_cases()
    if opts.quick:
        taken: collections.Counter[str] = collections.Counter()
        sample = []
        for case in cases:
            if taken[case.file] < QUICK_PER_FILE:
                taken[case.file] += 1
                sample.append(case)
        cases = sample
    started = time.perf_counter()
    verdicts = await run_corpus(cases, concurrency=4)
    seconds = time.perf_counter() - started
    rows = figures(verdicts)
    scope = f"a sample of {len(cases)} cases (--quick)" if opts.quick else f"all {len(cases)} cases"
    table("detection", ["family", "attacks", "caught", "recall", "precision", "benign look-alikes", "refused (FP)", "errors"],
          [(r.family, r.attacks, r.caught, fmt_ratio(r.recall), fmt_ratio(r.precision), r.benign, r.false_positives, r.errors)
           for r in rows],
          note=f"{scope} through dharma stdio (standard profile, every tool granted), 4 at a time, {seconds:.1f} s")
    for family in (*ATTACK_FAMILIES, "benign"):
        wrong = [v.case_id for v in verdicts if v.family == family and not v.ok]
        if wrong:
            print(f"   {family} not meeting the label: {', '.join(wrong)}")
    benign = [v for v in verdicts if v.family == "benign"]
    for r in rows:
        results.add(Target(f"detection recall ({r.family})", r.recall if r.attacks else None, RECALL_TARGET, "of attacks",
                           higher_is_better=True, note="" if r.attacks else "no case in this run"))
    allowed = sum(v.ok for v in benign)
    results.add(Target("detection benign look-alikes allowed", allowed / len(benign) if benign else None, 1.0, "of benign cases",
                       higher_is_better=True, note=f"{len(benign) - allowed} refused" if benign else "no case in this run"))

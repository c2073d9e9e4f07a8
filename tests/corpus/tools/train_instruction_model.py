"""Train the learned instruction score (`gateway/stages/sanitizer/instruction_model.py`).

usage (from the repository root):
  python tests/corpus/tools/train_instruction_model.py            # write data/instruction_model.json
  python tests/corpus/tools/train_instruction_model.py --check    # exit 1 unless the shipped file is reproduced
  python tests/corpus/tools/train_instruction_model.py --report   # validation precision/recall, counts per language

The training set is `instruction_training.tsv` beside this file: `lang<TAB>label<TAB>sentence`,
label 1 for a text addressed to an AI agent as an order (override, exfiltrate, call a tool, reveal
the prompt, forged authority, "always prefer this tool"), 0 for everything else (orders to humans,
documentation, security writing that quotes attacks, ordinary prose). Every fifth row is the
validation part (`--report` trains without it and measures on it); the shipped weights are trained
on every row; `--report` also trains without a quarter of the hand-written languages (chosen by a
digest of their code) and measures on their rows: how it does on a language it never saw. Logistic
regression by plain SGD (no numpy): binary unigram and bigram features, and per word the mean of its
character n-gram buckets (round 6); balanced class weights, L2, a fixed number of epochs, rows visited
in an order fixed by a digest, word weights rounded and the small ones dropped, n-gram buckets stored
as int8 times one scale, so the output is the same byte for byte on every run. Rows that are not
corpus windows (hand-written, public data) count HAND_WEIGHT times in the loss.

SOURCES (public data in the TSV, each block under a `#` line naming it; only MIT, Apache-2.0,
CC-BY or CC0 text; never InjecAgent, AgentDojo, Tensor Trust, garak, promptmap, PurpleLlama or
invariantlabs text, which held-out corpora use):
  microsoft/BIPIA (MIT), benchmark/text_attack_train.json: attacks that order something about
    the answer (the five question-style categories are left out), label 1.
  microsoft/BIPIA (MIT), benchmark/code_attack_train.json: the sentence before each injected code
    block, label 1.
  microsoft/BIPIA (MIT), benchmark/email/train.jsonl: sentence windows of the e-mail contexts
    (invoices from openai/evals, MIT per BIPIA's NOTICE.md), label 0.
  Not used: BIPIA's table and code contexts (CC BY-SA) and its test split; Open-Prompt-Injection
  and llmail-inject-challenge keep no text data in their GitHub repositories (checked again in
  round 7: llmail-inject-challenge's copy holds code and notebooks, no submissions; its fp_tests
  e-mails are held-out text and never used); deepset's and HackAPrompt's sets have no official
  GitHub copy. Round 7's rows (orders about the answer, forged notices, impersonated users,
  actions, code injection, and their hard negatives) are hand-written.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import sys
from array import array
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from gateway.stages.sanitizer import instruction_model as im  # noqa: E402

TSV = Path(__file__).with_name("instruction_training.tsv")
OUT = ROOT / "gateway" / "stages" / "sanitizer" / "data" / "instruction_model.json"
MODEL = "instruction-lr-3"
BUCKETS = 1 << 17  # character n-gram buckets
EPOCHS = 14
RATE = 0.25
L2 = 1e-4
KEEP = 0.02  # |weight| below this is dropped
THRESHOLD = 0.8
HAND_WEIGHT = 2.0  # a hand-written or dataset row counts this many times a corpus window
GRAM_POWER = 0.5  # a word's n-gram value: 1 / (its n-grams ** GRAM_POWER)


def rows() -> list[tuple[str, int, str]]:
    """The labelled sentences, in file order, duplicates dropped."""
    out, seen = [], set()
    for n, line in enumerate(TSV.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3 or parts[1] not in ("0", "1"):
            raise SystemExit(f"{TSV.name}:{n}: expected lang<TAB>0|1<TAB>sentence")
        if parts[2] not in seen:
            seen.add(parts[2])
            out.append((parts[0], int(parts[1]), parts[2]))
    return out


Model = tuple[float, dict[str, float], float, list[int]]  # bias, word weights, n-gram scale, n-gram int8


def _row_features(text: str) -> tuple[list[str], dict[int, float]]:
    """A row's word and concept features, and its n-gram buckets with their values (1/grams per word)."""
    subs: dict[int, float] = {}
    for word in im.subword_tokens(im.tokens(text)):
        found = im.grams(word, BUCKETS)
        for k in found:
            subs[k] = subs.get(k, 0.0) + 1.0 / len(found) ** GRAM_POWER
    return im.features(text), subs


def train(data: list[tuple[str, int, str]]) -> Model:
    """Weights by SGD on the logistic loss (balanced classes, L2)."""
    feats = [(*_row_features(t), y) for _, y, t in data]
    pos = sum(y for _, _, y in feats)
    cw = {1: len(feats) / (2.0 * max(1, pos)), 0: len(feats) / (2.0 * max(1, len(feats) - pos))}
    w: dict[str, float] = {}
    g = [0.0] * BUCKETS
    b = 0.0
    for epoch in range(EPOCHS):
        order = sorted(range(len(feats)), key=lambda i: hashlib.sha256(f"{epoch}:{data[i][2]}".encode()).digest())
        rate = RATE / (1.0 + epoch)
        for i in order:
            fs, subs, y = feats[i]
            z = b + sum(w.get(f, 0.0) for f in fs) + sum(g[k] * v for k, v in subs.items())
            z = max(-30.0, min(30.0, z))
            grad = (1.0 / (1.0 + math.exp(-z)) - y) * cw[y] * (1.0 if data[i][0] == "corpus" else HAND_WEIGHT)
            b -= rate * grad
            for f in fs:
                v = w.get(f, 0.0)
                w[f] = v - rate * (grad + L2 * v)
            for k, v in subs.items():
                g[k] -= rate * (grad * v + L2 * g[k])
    scale = round(max(1e-6, max(map(abs, g))) / 127.0, 8)
    return (round(b, 4), {f: round(v, 4) for f, v in sorted(w.items()) if abs(v) >= KEEP}, scale,
            [max(-127, min(127, round(v / scale))) for v in g])


def predictor(model: Model) -> Callable[[str], float]:
    """The probability a trained model gives one text, as the shipped file will score it."""
    b, w, scale, q = model

    def prob(text: str) -> float:
        z = b + sum(w.get(f, 0.0) for f in im.features(text))
        for word in im.subword_tokens(im.tokens(text)):
            found = im.grams(word, BUCKETS)
            z += sum(q[k] * scale for k in found) / len(found) ** GRAM_POWER
        return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))
    return prob


def rendered() -> str:
    b, w, scale, q = train(rows())
    sub = {"buckets": BUCKETS, "power": GRAM_POWER, "scale": scale, "int8": base64.b64encode(array("b", q).tobytes()).decode()}
    return json.dumps({"model": MODEL, "bias": b, "threshold": THRESHOLD, "weights": w, "subwords": sub},
                      ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"


def _measure(title: str, val: list[tuple[str, int, str]], prob: Callable[[str], float]) -> None:
    scored = [(lang, y, t, prob(t)) for lang, y, t in val]
    tp = sum(1 for _, y, _, p in scored if y and p >= THRESHOLD)
    fp = sum(1 for _, y, _, p in scored if not y and p >= THRESHOLD)
    fn = sum(1 for _, y, _, p in scored if y and p < THRESHOLD)
    print(f"{title}: {len(val)} rows, precision {tp / max(1, tp + fp):.3f} recall {tp / max(1, tp + fn):.3f} (tp {tp} fp {fp} fn {fn})")
    for lang, y, t, p in scored:
        if (p >= THRESHOLD) != bool(y):
            print(f"  {'FN' if y else 'FP'} {lang} {p:.2f} {t[:100]}")


def unseen_languages(data: list[tuple[str, int, str]]) -> set[str]:
    """A quarter of the hand-written languages (not English), chosen by a digest of their code."""
    return {lang for lang, _, _ in data if lang not in ("en", "corpus") and not lang.startswith("src:")
            and hashlib.sha256(lang.encode()).digest()[0] % 4 == 0}


def report() -> None:
    data = rows()
    print(f"rows {len(data)}, threshold {THRESHOLD}")
    _measure("validation (every fifth row)", [r for i, r in enumerate(data) if not i % 5],
             predictor(train([r for i, r in enumerate(data) if i % 5])))
    unseen = unseen_languages(data)
    print(f"languages never trained on: {' '.join(sorted(unseen))}")
    _measure("unseen languages", [r for r in data if r[0] in unseen], predictor(train([r for r in data if r[0] not in unseen])))
    counts = Counter((lang, y) for lang, y, _ in data)
    langs = sorted({lang for lang, _, _ in data})
    print(f"languages {len(langs)}: " + " ".join(f"{k}:{counts[(k, 1)]}/{counts[(k, 0)]}" for k in langs))


if __name__ == "__main__":
    if "--report" in sys.argv:
        report()
    elif "--check" in sys.argv:
        sys.exit(0 if OUT.read_text(encoding="utf-8") == rendered() else 1)
    else:
        OUT.write_text(rendered(), encoding="utf-8")
        print(f"wrote {OUT.relative_to(ROOT)}")

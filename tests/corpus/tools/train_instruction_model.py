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
on every row. Logistic regression by plain SGD (no numpy): binary unigram and bigram features,
balanced class weights, L2, a fixed number of epochs, rows visited in an order fixed by a digest,
weights rounded and the small ones dropped, so the output is the same byte for byte on every run.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from gateway.stages.sanitizer import instruction_model as im  # noqa: E402

TSV = Path(__file__).with_name("instruction_training.tsv")
OUT = ROOT / "gateway" / "stages" / "sanitizer" / "data" / "instruction_model.json"
MODEL = "instruction-lr-1"
EPOCHS = 14
RATE = 0.25
L2 = 1e-4
KEEP = 0.02  # |weight| below this is dropped
THRESHOLD = 0.8


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


def train(data: list[tuple[str, int, str]]) -> tuple[float, dict[str, float]]:
    """Weights by SGD on the logistic loss (balanced classes, L2)."""
    feats = [(im.features(t), y) for _, y, t in data]
    pos = sum(y for _, y in feats)
    cw = {1: len(feats) / (2.0 * max(1, pos)), 0: len(feats) / (2.0 * max(1, len(feats) - pos))}
    w: dict[str, float] = {}
    b = 0.0
    for epoch in range(EPOCHS):
        order = sorted(range(len(feats)), key=lambda i: hashlib.sha256(f"{epoch}:{data[i][2]}".encode()).digest())
        rate = RATE / (1.0 + epoch)
        for i in order:
            fs, y = feats[i]
            z = max(-30.0, min(30.0, b + sum(w.get(f, 0.0) for f in fs)))
            g = (1.0 / (1.0 + math.exp(-z)) - y) * cw[y]
            b -= rate * g
            for f in fs:
                v = w.get(f, 0.0)
                w[f] = v - rate * (g + L2 * v)
    return round(b, 4), {f: round(v, 4) for f, v in sorted(w.items()) if abs(v) >= KEEP}


def prob(b: float, w: dict[str, float], text: str) -> float:
    z = max(-30.0, min(30.0, b + sum(w.get(f, 0.0) for f in im.features(text))))
    return 1.0 / (1.0 + math.exp(-z))


def rendered() -> str:
    b, w = train(rows())
    return json.dumps({"model": MODEL, "bias": b, "threshold": THRESHOLD, "weights": w},
                      ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"


def report() -> None:
    data = rows()
    fit = [r for i, r in enumerate(data) if i % 5]
    val = [r for i, r in enumerate(data) if not i % 5]
    b, w = train(fit)
    tp = sum(1 for _, y, t in val if y and prob(b, w, t) >= THRESHOLD)
    fp = sum(1 for _, y, t in val if not y and prob(b, w, t) >= THRESHOLD)
    fn = sum(1 for _, y, t in val if y and prob(b, w, t) < THRESHOLD)
    print(f"rows {len(data)} (train {len(fit)}, validation {len(val)}), threshold {THRESHOLD}")
    print(f"validation precision {tp / max(1, tp + fp):.3f} recall {tp / max(1, tp + fn):.3f} (tp {tp} fp {fp} fn {fn})")
    for lang, y, t in val:
        if (prob(b, w, t) >= THRESHOLD) != bool(y):
            print(f"  {'FN' if y else 'FP'} {lang} {prob(b, w, t):.2f} {t[:100]}")
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

"""The karma ledger's exceptions. Every message names the ledger path or the record seq.

    LedgerError          anything the ledger cannot do (I/O, bad entry, bad checkpoint)
    ├── NotALedger       the file exists but is not a Dharma karma ledger
    └── LedgerLocked     another writer (another gateway) holds the ledger's lock file

No I/O here.
"""

from __future__ import annotations


class LedgerError(Exception):
    """The karma ledger could not do what was asked; the message says where and why."""


class NotALedger(LedgerError):
    """The path holds something other than a Dharma karma ledger; it was left untouched."""


class LedgerLocked(LedgerError):
    """Another process (or another ledger object in this one) is the ledger's one writer."""

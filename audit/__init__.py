"""The karma ledger: tamper-evident storage of every governed call."""

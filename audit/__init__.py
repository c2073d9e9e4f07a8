"""The karma ledger: tamper-evident storage of every governed call.

Modules, one job each (import them directly; this package imports nothing, so the gateway
core can use `audit.canon` without pulling in sqlite3):

    canon        RFC 8785 canonical JSON and digests
    strict_json  the one strict JSON decoder (I-JSON, bounded depth) every reader of outside JSON uses
    errors       LedgerError, NotALedger, LedgerLocked
    records      the record byte format and the values a store takes and returns
    merkle       RFC 9162 tree hash, compact range, inclusion and consistency proofs
    checkpoint   C2SP signed-note checkpoints (Ed25519)
    store        the LedgerStore / LedgerReader protocols
    sqlite       SqliteLedger (one writer, group commit); SqliteLedgerReader is importable here
    sqlite_read  SqliteLedgerReader (read-only, next to a live writer)
    sqlite_files the ledger file: schema, format and damage checks, the writer lock
    verify       verify_ledger: recompute everything, name the first bad seq
    query        query_records / format_records for auditors
    export       export bundles: write_bundle, verify_bundle (offline, with only a JWKS)
"""

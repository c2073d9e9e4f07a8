"""The decision core: the call's models (`call`), the stable error codes (`errors`), the ordered
declaration of every step a call goes through (`pipeline`) and the `Gateway` that runs it
(`gateway`). No I/O: storage, keys and backends come in through the interfaces in `backends`
and `gateway.stores`."""

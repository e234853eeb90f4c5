"""One pgqueuer worker process for the peers scenario: the peer doing the engine's drain
work (run as a script by peers.py; it imports nothing of the bench).

    python bench/harness/peer_pgqueuer.py --dsn DSN --url URL [--in-flight 100]
                                          [--batch-size 10]

What the issue's peer measurement describes: pgqueuer with asyncpg, uvloop and aiohttp,
`--in-flight` jobs at once in this process; each job POSTs its payload (~1 KB of JSON) to
the fake destination and completes on a 2xx (an exception otherwise, which pgqueuer
records as a failure). `webhook-id` is the job id, so the destination counts duplicates
as it does for the engine. Runs until terminated (peers.py stops it once the queue
is empty, after reading its CPU time). Needs `pip install -e '.[bench]'`.
"""

from __future__ import annotations

import argparse

import aiohttp
import asyncpg
import uvloop
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

ENTRYPOINT = "deliver"
TIMEOUT_S = 10.0  # the engine's default request timeout


async def work(dsn: str, url: str, in_flight: int, batch_size: int) -> None:
    connection = await asyncpg.connect(dsn)
    manager = QueueManager(Queries(AsyncpgDriver(connection)))
    connector = aiohttp.TCPConnector(limit=in_flight)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        @manager.entrypoint(ENTRYPOINT)
        async def deliver(job: Job) -> None:
            headers = {"content-type": "application/json", "webhook-id": f"pgq_{job.id}"}
            async with session.post(url, data=job.payload, headers=headers) as response:
                await response.read()
                if not 200 <= response.status < 300:
                    raise RuntimeError(f"HTTP {response.status}")

        await manager.run(batch_size=batch_size, max_concurrent_tasks=in_flight)
    await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--in-flight", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=10)
    args = parser.parse_args()
    uvloop.run(work(args.dsn, args.url, args.in_flight, args.batch_size))


if __name__ == "__main__":
    main()

"""Throughput of CurlPool against a loopback Node server that answers 200 `{}`.

From the repository root:

    python -m tools.http_client_bench [--concurrency 512] [--seconds 5] [--loop uvloop]

Prints one JSON line: POSTs/s and CPU microseconds per POST of this process
(libcurl runs in-process, so that is the whole client cost).
"""

import argparse
import asyncio
import json
import os
import subprocess
import time

import uvloop

from engine.http_client import CurlPool
from engine.signing import build_headers, generate_secret

NODE_SERVER = """
const http = require('http');
const server = http.createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    res.writeHead(200, {'content-type': 'application/json', 'content-length': 2});
    res.end('{}');
  });
});
server.keepAliveTimeout = 60000;
server.listen(0, '127.0.0.1', () => console.log(server.address().port));
"""


async def measure(
    url: str, concurrency: int, seconds: float, warmup: float, pools: int
) -> dict:
    all_pools = [CurlPool(max_connects=concurrency) for _ in range(pools)]
    body = b'{"type":"bench","payload":{"n":12345,"text":"' + b"x" * 200 + b'"}}'
    headers = build_headers([generate_secret()], "evt_bench", int(time.time()), body)
    completed = 0
    failures = 0
    stop_at = 0.0

    async def sender(pool: CurlPool) -> None:
        nonlocal completed, failures
        while time.monotonic() < stop_at:
            result = await pool.post(url, headers, body, 5000)
            if result.status_code == 200:
                completed += 1
            else:
                failures += 1

    stop_at = time.monotonic() + warmup
    await asyncio.gather(*(sender(all_pools[i % pools]) for i in range(concurrency)))
    completed = failures = 0
    cpu_start, wall_start = time.process_time(), time.monotonic()
    stop_at = wall_start + seconds
    await asyncio.gather(*(sender(all_pools[i % pools]) for i in range(concurrency)))
    wall, cpu = time.monotonic() - wall_start, time.process_time() - cpu_start
    for pool in all_pools:
        await pool.close()
    return {
        "posts_per_s": round(completed / wall),
        "cpu_us_per_post": round(cpu / completed * 1e6, 1),
        "cpu_util": round(cpu / wall, 2),
        "completed": completed,
        "failures": failures,
        "seconds": round(wall, 2),
        "concurrency": concurrency,
        "pools": pools,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--pools", type=int, default=1, help="CurlPools sharing the load")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()

    server = subprocess.Popen(["node", "-e", NODE_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        url = f"http://127.0.0.1:{port}/hook"
        run = uvloop.run if args.loop == "uvloop" else asyncio.run
        report = run(measure(url, args.concurrency, args.seconds, args.warmup, args.pools))
    finally:
        server.terminate()
        server.wait()
    report |= {"loop": args.loop, "cpus": os.cpu_count()}
    print(json.dumps(report))


if __name__ == "__main__":
    main()

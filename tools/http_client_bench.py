"""Throughput of CurlPool against a loopback Node server that answers 200 `{}`.

From the repository root:

    python -m tools.http_client_bench [--concurrency 512] [--seconds 5] [--loop uvloop]
                                      [--api callback|future] [--pools 1]

--pools N spreads the requests over N multi handles as a worker does (engine.worker.http.pools,
concurrency / N in flight in each; callback API only).

Prints one JSON line: POSTs/s and CPU microseconds per POST of this process
(libcurl runs in-process, so that is the whole client cost).
"""

import argparse
import asyncio
import json
import os
import subprocess
import time
from functools import partial

import uvloop

from engine.webhooks.signing import build_headers, generate_secret
from engine.worker.http.client import CurlPool, HttpResult
from engine.worker.http.pools import CurlPools

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
    url: str, concurrency: int, seconds: float, warmup: float, api: str, pools: int
) -> dict:
    pool = CurlPool(max_connects=concurrency)
    spread = CurlPools(concurrency, spread=-(-concurrency // pools)) if pools > 1 else None
    body = b'{"type":"bench","payload":{"n":12345,"text":"' + b"x" * 200 + b'"}}'
    headers = build_headers([generate_secret()], "evt_bench", int(time.time()), body)
    # start(on_done): one POST on the single pool, or as the worker starts it (--pools N).
    start = (partial(pool.start, url, headers, body, 5000) if spread is None
             else partial(spread.start_checked, url, headers, body, 5000, True))
    completed = 0
    failures = 0
    stop_at = 0.0

    async def sender() -> None:  # --api future: a task awaiting `post` per request
        nonlocal completed, failures
        while time.monotonic() < stop_at:
            result = await pool.post(url, headers, body, 5000)
            if result.status_code == 200:
                completed += 1
            else:
                failures += 1

    async def callbacks() -> None:  # --api callback: `start`, as the worker does
        all_done = asyncio.get_running_loop().create_future()
        running = concurrency

        def on_done(result: HttpResult | None) -> None:
            nonlocal completed, failures, running
            if result is not None and result.status_code == 200:
                completed += 1
            else:
                failures += 1
            if time.monotonic() < stop_at:
                start(on_done)
            else:
                running -= 1
                if running == 0:
                    all_done.set_result(None)

        for _ in range(concurrency):
            start(on_done)
        await all_done

    async def run_all() -> None:
        if api == "callback":
            await callbacks()
        else:
            await asyncio.gather(*(sender() for _ in range(concurrency)))

    stop_at = time.monotonic() + warmup
    await run_all()
    completed = failures = 0
    cpu_start, wall_start = time.process_time(), time.monotonic()
    stop_at = wall_start + seconds
    await run_all()
    wall, cpu = time.monotonic() - wall_start, time.process_time() - cpu_start
    await pool.close()
    if spread is not None:
        await spread.close()
    return {
        "posts_per_s": round(completed / wall),
        "cpu_us_per_post": round(cpu / completed * 1e6, 1),
        "cpu_util": round(cpu / wall, 2),
        "completed": completed,
        "failures": failures,
        "seconds": round(wall, 2),
        "concurrency": concurrency,
        "api": api,
        "pools": pools,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--api", choices=["future", "callback"], default="callback")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--pools", type=int, default=1)
    args = parser.parse_args()
    if args.pools > 1 and args.api != "callback":
        parser.error("--pools needs --api callback")

    server = subprocess.Popen(["node", "-e", NODE_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        url = f"http://127.0.0.1:{port}/hook"
        run = uvloop.run if args.loop == "uvloop" else asyncio.run
        report = run(measure(url, args.concurrency, args.seconds, args.warmup, args.api,
                             args.pools))
    finally:
        server.terminate()
        server.wait()
    report |= {"loop": args.loop, "cpus": os.cpu_count()}
    print(json.dumps(report))


if __name__ == "__main__":
    main()

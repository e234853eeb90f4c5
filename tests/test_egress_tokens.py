"""A worker's OAuth2 tokens (engine/worker/egress.py): past its refresh time a live token
is still sent while the next one is fetched in the background, and a worker fetches one
token at a time per destination, however many sends need it. A real token endpoint (slow
on purpose), a real receiver that checks the bearer token, the real database."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

import psycopg
from psycopg.types.json import Jsonb

from engine.domain import Claim
from engine.webhooks.targets import system_lookup
from engine.worker.egress import EgressSide
from engine.worker.http.pools import CurlPools
from engine.worker.http.transfer import HttpResult
from tests.kit.data import add_destination
from tests.kit.egress_servers import Receiver, TokenEndpoint, receiver, token_endpoint

FETCH_DELAY_S = 1.0
SENDS = 5


def oauth_destination(conn: psycopg.Connection, dest: Receiver, tokens: TokenEndpoint) -> int:
    return add_destination(
        conn, url=dest.url(), egress_revision=1,
        auth=Jsonb({"type": "oauth2_client_credentials", "token_url": tokens.url,
                    "client_id": "engine", "client_secret": "s3cr3t"}))


async def send_all(side: EgressSide, destination: int, url: str, n: int
                   ) -> list[tuple[HttpResult | None, float]]:
    """`n` sends at once; each one's result and how long it took."""
    loop = asyncio.get_running_loop()
    began = time.monotonic()
    futures = []
    for i in range(n):
        future: asyncio.Future[tuple[HttpResult | None, float]] = loop.create_future()
        claim = Claim(i + 1, i + 1, destination, 1, url, 5000, ["s"], "{}",
                      egress_revision=1)

        def done(result: HttpResult | None,
                 future: asyncio.Future[tuple[HttpResult | None, float]] = future) -> None:
            future.set_result((result, time.monotonic() - began))
        side.send(claim, ["content-type: application/json"], b"{}", 5000, done)
        futures.append(future)
    return list(await asyncio.gather(*futures))


def run_side(dsn: str, scenario: Callable[[EgressSide], Awaitable[None]]) -> None:
    async def main() -> None:
        http = CurlPools(64)
        side = EgressSide(dsn, http, True, system_lookup, None, None)
        try:
            await scenario(side)
        finally:
            await side.close()
            await http.close()
    asyncio.run(main())


def test_a_live_token_is_sent_while_its_successor_is_fetched(
    dsn: str, conn: psycopg.Connection
) -> None:
    with token_endpoint("engine", "s3cr3t", 60.0) as tokens, \
            receiver(tokens=tokens) as dest:
        destination = oauth_destination(conn, dest, tokens)

        async def scenario(side: EgressSide) -> None:
            first = await send_all(side, destination, dest.url(), 1)
            assert first[0][0] is not None and first[0][0].status_code == 200
            assert tokens.calls == 1
            # Its refresh time has come, here and in the database; it lives on.
            held = side.tokens[destination]
            side.tokens[destination] = dataclasses.replace(
                held, usable_until=time.monotonic() - 1)
            conn.execute("UPDATE oauth_tokens SET refresh_at = now()")
            tokens.delay_s = FETCH_DELAY_S
            sent = await send_all(side, destination, dest.url(), SENDS)
            assert [r.status_code for r, _ in sent if r is not None] == [200] * SENDS
            assert max(took for _, took in sent) < FETCH_DELAY_S / 2, sent
            # One fetch behind them, and its token is the one sent next.
            for _ in range(100):
                if side.tokens[destination].token != held.token:
                    break
                await asyncio.sleep(0.05)
            assert tokens.calls == 2 and tokens.most_concurrent == 1
            assert side.tokens[destination].token == "tok-2"

        run_side(dsn, scenario)


def test_sends_past_a_tokens_life_wait_for_one_fetch(
    dsn: str, conn: psycopg.Connection
) -> None:
    with token_endpoint("engine", "s3cr3t", 60.0) as tokens, \
            receiver(tokens=tokens) as dest:
        destination = oauth_destination(conn, dest, tokens)

        async def scenario(side: EgressSide) -> None:
            tokens.delay_s = FETCH_DELAY_S / 4
            sent = await send_all(side, destination, dest.url(), SENDS)
            assert [r.status_code for r, _ in sent if r is not None] == [200] * SENDS
            assert tokens.calls == 1 and tokens.most_concurrent == 1
            # Expired here and due in the database: every send waits, for one fetch.
            held = side.tokens[destination]
            side.tokens[destination] = dataclasses.replace(
                held, usable_until=time.monotonic() - 2, alive_until=time.monotonic() - 1)
            conn.execute("UPDATE oauth_tokens SET refresh_at = now()")
            sent = await send_all(side, destination, dest.url(), SENDS)
            assert [r.status_code for r, _ in sent if r is not None] == [200] * SENDS
            assert tokens.calls == 2 and tokens.most_concurrent == 1
            assert dest.requests == 2 * SENDS and dest.rejected == 0

        run_side(dsn, scenario)

"""`engine send`, `engine deliveries [show ID]` and `engine replay`: events in, deliveries
out, dead letters back, through the /v1 API's handlers."""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.cli import output
from engine.cli.errors import CommandError
from engine.cli.parsing import add_json, add_tenant, json_argument, positive_id, tenant_path

if TYPE_CHECKING:  # the API's modules load only when a command runs, not for `engine --help`
    from engine.cli.local_api import LocalApi
from engine.webhooks.retry import parse_duration


def send(api: LocalApi, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"type": args.type,
                            "payload": json_argument("--payload", args.payload)}
    if args.channel:
        body["channels"] = args.channel
    if args.destination:
        body["destination_ids"] = args.destination
    if args.ordering_key is not None:
        body["ordering_key"] = args.ordering_key
    headers = {} if args.idempotency_key is None else {"Idempotency-Key": args.idempotency_key}
    answer = api.check("POST", tenant_path(args, "/v1/events"), body, headers=headers)
    if args.json:
        output.print_json(answer.body)
    else:
        accepted = answer.json()
        count = accepted["deliveries"]
        output.line(f"accepted event {accepted['id']}: {count} "
                    f"deliver{'y' if count == 1 else 'ies'}")
    return 0


_DELIVERY_COLUMNS = ["id", "event", "destination", "status", "attempt", "next attempt",
                     "last error"]


def _delivery_row(d: dict[str, Any]) -> list[Any]:
    due = output.when(d["next_attempt_at"]) if d["status"] == "pending" else "-"
    return [d["id"], d["event_id"], d["destination_id"], d["status"], d["attempt"], due,
            d["last_error"]]


def list_deliveries(api: LocalApi, args: argparse.Namespace) -> int:
    query = {name: value for name, value in (
        ("status", args.status), ("destination_id", args.destination), ("limit", args.limit),
    ) if value is not None}
    answer = api.check("GET", tenant_path(args, "/v1/deliveries"), query=query)
    if args.json:
        output.print_json(answer.body)
        return 0
    page = answer.json()
    if not page["data"]:
        output.line("no deliveries match")
        return 0
    output.table(None, _DELIVERY_COLUMNS, [_delivery_row(d) for d in page["data"]])
    if page["next"]:
        output.line(f"(more: raise --limit, at most 1000; the API pages with after={page['next']})")
    return 0


def show_delivery(api: LocalApi, args: argparse.Namespace) -> int:
    answer = api.check("GET", tenant_path(args, f"/v1/deliveries/{args.id}"))
    if args.json:
        output.print_json(answer.body)
        return 0
    d = answer.json()
    output.fields([
        ("id", d["id"]), ("tenant", d.get("tenant")), ("event", d["event_id"]),
        ("destination", d["destination_id"]),
        ("status", d["status"]), ("attempt", d["attempt"]),
        ("next attempt", output.when(d["next_attempt_at"])),
        ("last error", d["last_error"]), ("created", output.when(d["created_at"])),
        ("completed", output.when(d["completed_at"])),
    ])
    if not d["attempts"]:
        output.line("no attempts yet")
        return 0
    output.table("attempts", ["attempt", "started", "ms", "status", "error", "response"], [
        (a["attempt"], output.when(a["started_at"]), a["duration_ms"], a["status_code"],
         a["error"], (a["response_body"] or "")[:80] or None)
        for a in d["attempts"]
    ])
    return 0


def _since(text: str | None) -> str | None:
    """--since takes an RFC 3339 time (as the API) or a duration back from now (`2h`)."""
    if text is None:
        return None
    try:
        seconds = parse_duration(text)
    except ValueError:
        return text  # the API validates it as a time
    return (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)).isoformat()


def replay(api: LocalApi, args: argparse.Namespace) -> int:
    if (args.id is None) == (args.destination is None):
        raise CommandError("replay: give a delivery ID, or --destination ID (not both)")
    if args.id is not None:
        if args.since is not None:
            raise CommandError("replay: --since goes with --destination")
        answer = api.check("POST", tenant_path(args, f"/v1/deliveries/{args.id}/replay"))
        text = f"delivery {args.id} is pending again, as a first attempt"
    else:
        body: dict[str, Any] = {"status": "dead"}
        since = _since(args.since)
        if since is not None:
            body["since"] = since
        answer = api.check(
            "POST", tenant_path(args, f"/v1/destinations/{args.destination}/replay"), body)
        count = answer.json()["replayed"]
        text = (f"replayed {count} dead deliver{'y' if count == 1 else 'ies'} of destination"
                f" {args.destination}")
    if args.json:
        output.print_json(answer.body)
    else:
        output.line(text)
    return 0


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> None:
    p = sub.add_parser("send", help="enqueue one event (as POST /v1/events)")
    add_common(p)
    add_json(p)
    p.add_argument("--type", required=True, metavar="T", help="event type")
    p.add_argument("--payload", required=True, metavar="JSON|@FILE",
                   help="the payload: JSON text, or @FILE to read it from a file")
    p.add_argument("--destination", type=positive_id, action="append", metavar="ID",
                   help="only to this destination (repeat; default: all subscribed)")
    p.add_argument("--idempotency-key", metavar="K",
                   help="a repeat with the same key is answered without a second event")
    p.add_argument("--ordering-key", metavar="K", help="ordering key for ordered destinations")
    p.add_argument("--channel", action="append", metavar="C",
                   help="a channel of the event (repeat): it then reaches only destinations"
                        " subscribed to one of them")
    add_tenant(p)
    p.set_defaults(operator_command=send)

    p = sub.add_parser("deliveries", help="list deliveries, newest first; `show ID` for one")
    add_common(p)
    add_json(p)
    p.add_argument("--status", metavar="S", help="pending, in_flight, delivered or dead")
    p.add_argument("--destination", metavar="ID", help="only this destination's")
    p.add_argument("--limit", metavar="N", help="at most N rows (1-1000, default 100)")
    add_tenant(p)
    p.set_defaults(operator_command=list_deliveries)
    actions = p.add_subparsers(dest="deliveries_command", metavar="ACTION")
    show = actions.add_parser("show", help="one delivery with its attempts")
    add_common(show)
    add_json(show)
    show.add_argument("id", type=positive_id, help="delivery id")
    add_tenant(show, on_subcommand=True)
    show.set_defaults(operator_command=show_delivery)

    p = sub.add_parser("replay", help="replay a delivery, or a destination's dead deliveries")
    add_common(p)
    add_json(p)
    p.add_argument("id", nargs="?", type=positive_id, help="delivery id")
    p.add_argument("--destination", type=positive_id, metavar="ID",
                   help="replay this destination's dead deliveries")
    p.add_argument("--since", metavar="TIME",
                   help="only those that died since TIME (RFC 3339, or a duration ago: 2h)")
    add_tenant(p)
    p.set_defaults(operator_command=replay)

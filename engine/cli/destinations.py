"""`engine destinations list | show ID | create URL … | pause | resume | disable |
rotate-secret | delete`: the /v1/destinations API from the command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.cli import output
from engine.cli.parsing import add_json, add_tenant, json_argument, positive_id, tenant_path

if TYPE_CHECKING:  # the API's modules load only when a command runs, not for `engine --help`
    from engine.cli.local_api import LocalApi

DestinationAction = Callable[["LocalApi", argparse.Namespace], int]


def _state(d: dict[str, Any]) -> str:
    if d["disabled"]:
        return "disabled"
    if d["paused"]:
        return "paused"
    return "active"


def _print_list(destinations: list[dict[str, Any]]) -> None:
    if not destinations:
        output.line("no destinations: create one with `engine destinations create URL`")
        return
    output.table(None, ["id", "url", "state", "breaker", "failures", "max in flight",
                        "timeout ms", "event types"], [
        (d["id"], d["url"], _state(d), d["breaker"], d["consecutive_failures"],
         d["max_in_flight"], d["timeout_ms"], d["event_types"] or "all")
        for d in destinations
    ])


def _print_one(d: dict[str, Any]) -> None:
    pairs: list[tuple[str, Any]] = [
        ("id", d["id"]), ("url", d["url"]), ("state", _state(d)),
        ("disabled reason", d.get("disabled_reason")),
        ("breaker", d["breaker"]), ("paused until", output.when(d.get("paused_until"))),
        ("consecutive failures", d["consecutive_failures"]),
        ("event types", d["event_types"] or "all"),
        ("max in flight", d["max_in_flight"]), ("ordered", d["ordered"]),
        ("timeout ms", d["timeout_ms"]),
    ]
    # Fields other features add to the API (rate_limit, headers, …) show as they come.
    shown = {"id", "url", "paused", "disabled", "disabled_reason", "breaker", "paused_until",
             "consecutive_failures", "event_types", "max_in_flight", "ordered", "timeout_ms",
             "secret", "previous_secret_until", "created_at", "updated_at"}
    pairs += [(name.replace("_", " "), value) for name, value in d.items()
              if name not in shown]
    pairs += [("created", output.when(d["created_at"])), ("updated", output.when(d["updated_at"]))]
    if "secret" in d:
        pairs.append(("secret", d["secret"]))
        if d.get("previous_secret_until"):
            pairs.append(("previous secret signs until", output.when(d["previous_secret_until"])))
    output.fields(pairs)


def _show(answer_body: bytes, as_json: bool, value: Any) -> int:
    if as_json:
        output.print_json(answer_body)
    else:
        _print_one(value)
    return 0


def list_destinations(api: LocalApi, args: argparse.Namespace) -> int:
    answer = api.check("GET", tenant_path(args, "/v1/destinations"))
    if args.json:
        output.print_json(answer.body)
    else:
        _print_list(answer.json()["data"])
    return 0


def show_destination(api: LocalApi, args: argparse.Namespace) -> int:
    answer = api.check("GET", tenant_path(args, f"/v1/destinations/{args.id}"))
    return _show(answer.body, args.json, answer.json())


def create_destination(api: LocalApi, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"url": args.url}
    if args.event_type:
        body["event_types"] = args.event_type
    for name, value in (("max_in_flight", args.cap_in_flight), ("rate_limit", args.rate_limit),
                        ("timeout_ms", args.timeout_ms), ("secret", args.secret)):
        if value is not None:
            body[name] = value
    if args.ordered:
        body["ordered"] = True
    if args.channel:
        body["channels"] = args.channel
    if args.filter is not None:
        body["filter"] = json_argument("--filter", args.filter)
    answer = api.check("POST", tenant_path(args, "/v1/destinations"), body)
    return _show(answer.body, args.json, answer.json())


def _patch(change: dict[str, Any]) -> DestinationAction:
    def run(api: LocalApi, args: argparse.Namespace) -> int:
        answer = api.check("PATCH", tenant_path(args, f"/v1/destinations/{args.id}"), change)
        return _show(answer.body, args.json, answer.json())

    return run


def delete_destination(api: LocalApi, args: argparse.Namespace) -> int:
    api.check("DELETE", tenant_path(args, f"/v1/destinations/{args.id}"))
    if args.json:
        output.print_json(b'{"deleted": %d}' % args.id)
    else:
        output.line(f"deleted destination {args.id} (its deliveries are kept)")
    return 0


ACTIONS: dict[str, tuple[str, DestinationAction]] = {
    "pause": ("stop delivering to it; its deliveries wait", _patch({"paused": True})),
    "resume": ("deliver again (clears pause, disable and the breaker)",
               _patch({"paused": False, "disabled": False})),
    "disable": ("disable it (as a 410 would); its deliveries wait", _patch({"disabled": True})),
    "rotate-secret": ("new signing secret; the old one keeps signing for 24 h",
                      _patch({"rotate_secret": True})),
}


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> None:
    parser = sub.add_parser("destinations", help="list, create, pause, resume, … destinations")
    add_common(parser)
    add_tenant(parser)
    actions = parser.add_subparsers(dest="destinations_command", metavar="ACTION",
                                    required=True)

    def action(name: str, help_text: str, run: DestinationAction,
               takes_id: bool = True) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help_text)
        add_common(p)
        add_json(p)
        add_tenant(p, on_subcommand=True)
        if takes_id:
            p.add_argument("id", type=positive_id, help="destination id")
        p.set_defaults(operator_command=run)
        return p

    action("list", "all destinations", list_destinations, takes_id=False)
    action("show", "one destination", show_destination)
    create = action("create", "a new destination (prints its secret)", create_destination,
                    takes_id=False)
    create.add_argument("url", help="http(s) URL the deliveries are POSTed to")
    create.add_argument("--event-type", action="append", metavar="T",
                        help="deliver only events of this type (repeat; default: all)")
    # Its own dest: `max_in_flight` on the namespace is the engine's per-worker setting.
    create.add_argument("--max-in-flight", type=int, metavar="N", dest="cap_in_flight",
                        help="at most N concurrent requests to it, across all processes")
    create.add_argument("--rate-limit", type=float, metavar="R",
                        help="at most R requests per second to it")
    create.add_argument("--timeout-ms", type=int, metavar="N", help="request timeout")
    create.add_argument("--secret", help="whsec_… signing secret (default: a new one)")
    create.add_argument("--ordered", action="store_true",
                        help="deliver one at a time per ordering key, in order")
    create.add_argument("--channel", action="append", metavar="C",
                        help="subscribe to this channel (repeat; events with channels reach"
                             " only their subscribers)")
    create.add_argument("--filter", metavar="JSON|@FILE",
                        help="deliver only events whose payload matches this filter")
    create.add_argument(
        "--allow-private-targets", action="store_true", default=argparse.SUPPRESS,
        help="allow loopback/private addresses (as the engine's flag of that name)",
    )
    for name, (help_text, run) in ACTIONS.items():
        action(name, help_text, run)
    action("delete", "delete it (its deliveries are kept)", delete_destination)

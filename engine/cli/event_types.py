"""`engine event-types list | show NAME | create NAME [--description D] [--schema J]
[--example J] [--deprecated] | delete NAME`: the event-type catalog's routes from the
command line, as the admin. J is JSON inline or @FILE."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import msgspec

from engine.cli import output
from engine.cli.parsing import add_json, json_argument

if TYPE_CHECKING:
    from engine.cli.local_api import LocalApi


def _print_type(t: dict[str, Any]) -> None:
    encode = msgspec.json.encode
    output.fields([
        ("name", t["name"]), ("description", t["description"]),
        ("deprecated", "yes" if t["deprecated"] else "no"),
        ("schema", None if t["schema"] is None else encode(t["schema"]).decode()),
        ("example", None if t["example"] is None else encode(t["example"]).decode()),
        ("created", output.when(t["created_at"])), ("updated", output.when(t["updated_at"])),
    ])


def list_types(api: LocalApi, args: argparse.Namespace) -> int:
    query = {name: value for name, value in (("limit", args.limit), ("after", args.after))
             if value is not None}
    answer = api.check("GET", "/v1/event-types", query=query)
    if args.json:
        output.print_json(answer.body)
        return 0
    page = answer.json()
    output.table(None, ["name", "description", "schema", "deprecated"], [
        (t["name"], t["description"], "yes" if t["schema"] is not None else "-",
         "yes" if t["deprecated"] else "")
        for t in page["data"]
    ])
    if page["next"]:
        output.line(f"(more: engine event-types list --after {page['next']})")
    return 0


def show_type(api: LocalApi, args: argparse.Namespace) -> int:
    answer = api.check("GET", f"/v1/event-types/{quote(args.name, safe='')}")
    if args.json:
        output.print_json(answer.body)
    else:
        _print_type(answer.json())
    return 0


def create_type(api: LocalApi, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name, "deprecated": args.deprecated}
    if args.description is not None:
        body["description"] = args.description
    for flag in ("schema", "example"):
        value = getattr(args, flag)
        if value is not None:
            body[flag] = json_argument(f"--{flag}", value)
    answer = api.check("POST", "/v1/event-types", body)
    if args.json:
        output.print_json(answer.body)
    else:
        _print_type(answer.json())
    return 0


def delete_type(api: LocalApi, args: argparse.Namespace) -> int:
    api.check("DELETE", f"/v1/event-types/{quote(args.name, safe='')}")
    if args.json:
        output.print_json(msgspec.json.encode({"deleted": args.name}))
    else:
        output.line(f"deleted event type {args.name} from the catalog (its events are kept)")
    return 0


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> None:
    parser = sub.add_parser("event-types", help="the event-type catalog")
    add_common(parser)
    actions = parser.add_subparsers(dest="event_types_command", metavar="ACTION",
                                    required=True)

    def action(name: str, help_text: str, run: Callable[[LocalApi, argparse.Namespace], int],
               takes_name: bool = True) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help_text)
        add_common(p)
        add_json(p)
        if takes_name:
            p.add_argument("name", metavar="NAME", help="the event type, e.g. order.created")
        p.set_defaults(operator_command=run)
        return p

    listing = action("list", "event types by name", list_types, takes_name=False)
    listing.add_argument("--limit", metavar="N", help="at most N rows (1-1000, default 100)")
    listing.add_argument("--after", metavar="CURSOR", help="the page after this cursor")
    action("show", "one event type with its schema and example", show_type)
    create = action("create", "add an event type to the catalog", create_type)
    create.add_argument("--description", metavar="D", help="what the event means")
    create.add_argument("--schema", metavar="JSON", help="a JSON Schema, inline or @FILE")
    create.add_argument("--example", metavar="JSON",
                        help="an example payload (must pass the schema), inline or @FILE")
    create.add_argument("--deprecated", action="store_true", help="mark it deprecated")
    action("delete", "remove an event type from the catalog", delete_type)

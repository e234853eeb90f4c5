"""`engine portal link T [--expires-in S] [--read-only]` and `engine portal rotate-key`:
the portal routes of the API from the command line, as the admin (T: the tenant's id or
uid). A link printed here names the engine's --bind address as its host; one made through
the API names the Host the caller used."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.cli import output
from engine.cli.parsing import add_json, tenant_reference

if TYPE_CHECKING:
    from engine.cli.local_api import LocalApi


def make_link(api: LocalApi, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"read_only": args.read_only}
    if args.expires_in is not None:
        body["expires_in"] = args.expires_in
    answer = api.check("POST", f"/v1/tenants/{args.tenant}/portal", body,
                       headers={"host": api.settings.bind})
    if args.json:
        output.print_json(answer.body)
        return 0
    link = answer.json()
    output.fields([("tenant", link["tenant"]), ("url", link["url"]),
                   ("expires", output.when(link["expires_at"])),
                   ("read only", "yes" if link["read_only"] else "no")])
    return 0


def rotate_key(api: LocalApi, args: argparse.Namespace) -> int:
    answer = api.check("POST", "/v1/portal-key/rotate")
    if args.json:
        output.print_json(answer.body)
    else:
        output.line(f"portal signing key {answer.json()['key_id']} made: every portal link"
                    " made before is refused by every ingress process within a second")
    return 0


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> None:
    parser = sub.add_parser("portal", help="customer portal links and their signing key")
    add_common(parser)
    actions = parser.add_subparsers(dest="portal_command", metavar="ACTION", required=True)
    link = actions.add_parser("link", help="a signed, short-lived link to a tenant's portal")
    add_common(link)
    add_json(link)
    link.add_argument("tenant", type=tenant_reference, metavar="T",
                      help="the tenant's id or uid")
    link.add_argument("--expires-in", type=int, metavar="SECONDS",
                      help="how long the link works (default 3600, at most 604800: 7 days)")
    link.add_argument("--read-only", action="store_true",
                      help="the link can read but change nothing")
    link.set_defaults(operator_command=make_link)
    rotate = actions.add_parser("rotate-key", help="a new signing key: every link made"
                                " before stops working")
    add_common(rotate)
    add_json(rotate)
    rotate.set_defaults(operator_command=rotate_key)

"""`engine tenants list | create UID | show T | delete T` and `engine keys create T | list T |
revoke T ID`: the /v1/tenants API from the command line, as the admin (T: the tenant's
id or uid)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.cli import output
from engine.cli.parsing import add_json, positive_id, tenant_reference

if TYPE_CHECKING:  # the API's modules load only when a command runs, not for `engine --help`
    from engine.cli.local_api import LocalApi

TenantAction = Callable[["LocalApi", argparse.Namespace], int]

# Said with every new key: the API keeps only its hash (SPEC "Tenants and API keys").
KEY_SHOWN_ONCE = "this key is shown once and cannot be shown again: store it now"


def _limits(t: dict[str, Any]) -> str:
    parts = []
    if t["max_in_flight"] is not None:
        parts.append(f"{t['max_in_flight']} in flight")
    if t["rate_limit"] is not None:
        parts.append(f"{t['rate_limit']:g}/s")
    return ", ".join(parts) or "-"


def _print_tenant(t: dict[str, Any]) -> None:
    output.fields([
        ("id", t["id"]), ("uid", t["uid"]), ("name", t["name"]),
        ("state", "disabled" if t["disabled"] else "active"),
        ("max in flight", t["max_in_flight"]), ("rate limit", t["rate_limit"]),
        ("pending", t["pending"]), ("in flight", t["in_flight"]),
        ("metadata", None if t["metadata"] is None else
         ", ".join(f"{k}={v}" for k, v in t["metadata"].items()) or "{}"),
        ("created", output.when(t["created_at"])), ("updated", output.when(t["updated_at"])),
    ])


def _print_or_json(answer_body: bytes, as_json: bool, show: Callable[[], None]) -> int:
    if as_json:
        output.print_json(answer_body)
    else:
        show()
    return 0


def list_tenants(api: LocalApi, args: argparse.Namespace) -> int:
    query = {name: value for name, value in (("limit", args.limit), ("after", args.after))
             if value is not None}
    answer = api.check("GET", "/v1/tenants", query=query)
    if args.json:
        output.print_json(answer.body)
        return 0
    page = answer.json()
    output.table(None, ["id", "uid", "name", "state", "pending", "in flight", "limits",
                        "created"], [
        (t["id"], t["uid"], t["name"], "disabled" if t["disabled"] else "active",
         t["pending"], t["in_flight"], _limits(t), output.when(t["created_at"]))
        for t in page["data"]
    ])
    if page["next"]:
        output.line(f"(more: engine tenants list --after {page['next']})")
    return 0


def create_tenant(api: LocalApi, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"uid": args.uid}
    if args.name is not None:
        body["name"] = args.name
    answer = api.check("POST", "/v1/tenants", body)
    return _print_or_json(answer.body, args.json, lambda: _print_tenant(answer.json()))


def show_tenant(api: LocalApi, args: argparse.Namespace) -> int:
    answer = api.check("GET", f"/v1/tenants/{args.tenant}")
    return _print_or_json(answer.body, args.json, lambda: _print_tenant(answer.json()))


def delete_tenant(api: LocalApi, args: argparse.Namespace) -> int:
    api.check("DELETE", f"/v1/tenants/{args.tenant}")
    if args.json:
        output.print_json(b'{"deleted": "%s"}' % args.tenant.encode())
    else:
        output.line(f"deleted tenant {args.tenant}: its keys, destinations and pending"
                    " deliveries are gone")
    return 0


def create_key(api: LocalApi, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name}
    if args.scope:
        body["scopes"] = args.scope
    answer = api.check("POST", f"/v1/tenants/{args.tenant}/keys", body)
    if args.json:
        output.print_json(answer.body)
        # stdout stays the API's JSON for scripts; the warning goes beside it.
        print(f"engine: {KEY_SHOWN_ONCE}", file=sys.stderr)
        return 0
    k = answer.json()
    output.fields([("id", k["id"]), ("tenant", k["tenant"]), ("name", k["name"]),
                   ("scopes", k["scopes"]), ("key", k["key"])])
    output.line(f"({KEY_SHOWN_ONCE})")
    return 0


def list_keys(api: LocalApi, args: argparse.Namespace) -> int:
    answer = api.check("GET", f"/v1/tenants/{args.tenant}/keys")
    if args.json:
        output.print_json(answer.body)
        return 0
    keys = answer.json()["data"]
    if not keys:
        output.line(f"no keys: create one with `engine keys create {args.tenant}`")
        return 0
    output.table(None, ["id", "name", "prefix", "scopes", "created", "last used"], [
        (k["id"], k["name"], k["prefix"] + "…", k["scopes"], output.when(k["created_at"]),
         output.when(k["last_used_at"]))
        for k in keys
    ])
    return 0


def revoke_key(api: LocalApi, args: argparse.Namespace) -> int:
    api.check("DELETE", f"/v1/tenants/{args.tenant}/keys/{args.id}")
    if args.json:
        output.print_json(b'{"revoked": %d}' % args.id)
    else:
        output.line(f"revoked key {args.id} of tenant {args.tenant}: every ingress process"
                    " refuses it within a second")
    return 0


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> None:
    def actions_of(name: str, help_text: str) -> argparse._SubParsersAction:
        parser = sub.add_parser(name, help=help_text)
        add_common(parser)
        return parser.add_subparsers(dest=f"{name}_command", metavar="ACTION", required=True)

    def action(actions: argparse._SubParsersAction, name: str, help_text: str,
               run: TenantAction, takes_tenant: bool = True) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help_text)
        add_common(p)
        add_json(p)
        if takes_tenant:
            p.add_argument("tenant", type=tenant_reference, metavar="T",
                           help="the tenant's id or uid")
        p.set_defaults(operator_command=run)
        return p

    tenants = actions_of("tenants", "list, create, show, delete tenants")
    listing = action(tenants, "list", "tenants by id, with their backlog", list_tenants,
                     takes_tenant=False)
    listing.add_argument("--limit", metavar="N", help="at most N rows (1-1000, default 100)")
    listing.add_argument("--after", metavar="CURSOR", help="the page after this cursor")
    create = action(tenants, "create", "a new tenant", create_tenant, takes_tenant=False)
    create.add_argument("uid", metavar="UID",
                        help="your own id for the customer: 1-64 of A-Z a-z 0-9 . _ : -")
    create.add_argument("--name", metavar="N", help="a name to show")
    action(tenants, "show", "one tenant with its backlog", show_tenant)
    action(tenants, "delete", "delete it: its keys, destinations and pending deliveries",
           delete_tenant)

    keys = actions_of("keys", "create, list, revoke a tenant's API keys")
    create = action(keys, "create", "a new key (printed once)", create_key)
    create.add_argument("--name", metavar="N", default="cli",
                        help="what the key is for (default: cli)")
    create.add_argument("--scope", action="append", choices=("send", "read", "manage"),
                        help="send, read or manage (repeat; default: all three)")
    action(keys, "list", "the tenant's keys (never the keys themselves)", list_keys)
    revoke = action(keys, "revoke", "revoke a key", revoke_key)
    revoke.add_argument("id", type=positive_id, help="key id")

"""Token and key commands of `sa-core`: create-token, revoke-token, prune-idempotency-keys.

Exit codes: 0 done; 1 the token is unknown or the database unreachable (message on stderr); 2 bad
arguments or configuration.
A token is printed once, by create-token, and never again: revoke-token prints only its id.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.errors import NotFound
from jobqueue.core.tokens import SCOPES, issue_token, revoke_token
from jobqueue.engine.idempotency import prune_expired_keys
from jobqueue.operator.cli_pool import Answer, with_cli_pool
from jobqueue.operator.durations import DURATION_FORMS, shift

__all__ = ["add_token_commands", "parse_expiry"]

_EXPIRES_HELP = (f"a duration from now ({DURATION_FORMS}) or an ISO 8601 date or instant "
                 "(2027-01-31, 2027-01-31T12:00:00+00:00; no offset means UTC)")


def parse_expiry(text: str, now: datetime | None = None) -> datetime:
    """Parses `--expires`: a duration from `now`, or an absolute date or instant in the future.

    Raises:
        ValueError: neither form, not in the future, or past the year 9999.
    """
    now = now or datetime.now(UTC)
    if (later := shift(text, now, 1)) is not None:
        return later
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"not a duration or date: {text!r}; use {_EXPIRES_HELP}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    if when <= now:
        raise ValueError(f"{text!r} is not in the future")
    return when


def _expiry(text: str) -> datetime:
    try:
        return parse_expiry(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _create_token(args: argparse.Namespace) -> int:
    def create(pool: ConnectionPool[DictConnection]) -> Answer:
        issued = issue_token(pool, args.org, args.user, label=args.label, expires_at=args.expires,
                             scopes=tuple(args.scope))
        expires = issued.expires_at.isoformat() if issued.expires_at is not None else None
        until = f", expires {expires}" if expires else ""
        scoped = f", scopes {','.join(issued.scopes)}" if issued.scopes else ""
        return Answer(f"token {issued.id} for org {args.org}, user {args.user}{until}{scoped} "
                      f"(shown once): {issued.token}",
                      {"token": issued.token, "id": issued.id, "org_id": args.org,
                       "user_id": args.user, "expires_at": expires, "scopes": list(issued.scopes)})

    return with_cli_pool(create, args.json)


def _revoke_token(args: argparse.Namespace) -> int:
    def revoke(pool: ConnectionPool[DictConnection]) -> Answer:
        revoked = revoke_token(pool, args.token)
        if revoked is None:
            raise NotFound("no such token")
        state = "revoked" if revoked.newly else "was already revoked"
        return Answer(f"token {revoked.id} (org {revoked.org_id}, user {revoked.user_id}) {state} "
                      f"at {revoked.revoked_at.isoformat()}",
                      {"id": revoked.id, "org_id": revoked.org_id, "user_id": revoked.user_id,
                       "revoked_at": revoked.revoked_at, "newly_revoked": revoked.newly})

    return with_cli_pool(revoke, args.json)


def _prune_keys(args: argparse.Namespace) -> int:
    def prune(pool: ConnectionPool[DictConnection]) -> Answer:
        deleted = prune_expired_keys(pool)
        return Answer(f"deleted {deleted} expired idempotency key(s)", {"deleted": deleted})

    return with_cli_pool(prune, args.json)


def _id_number(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError("must be a non-negative 64-bit integer")
    return value


def add_token_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds create-token, revoke-token and prune-idempotency-keys to `sa-core`'s subcommands."""
    token = sub.add_parser("create-token", help="create an API token (printed once)")
    token.add_argument("--org", type=_id_number, required=True)
    token.add_argument("--user", type=_id_number, required=True)
    token.add_argument("--label", default=None)
    token.add_argument("--expires", type=_expiry, default=None, metavar="DURATION_OR_DATE",
                       help=f"the token stops working then: {_EXPIRES_HELP} (default: never)")
    token.add_argument("--scope", action="append", choices=SCOPES, default=[],
                       help="also allow this (repeatable): `ops` opens /mission/ops and "
                            "/sa-core/v1/ops/ (every org's jobs); default: none")
    token.add_argument("--json", action="store_true",
                       help='print {"token", "id", "org_id", "user_id", "expires_at", "scopes"}')
    token.set_defaults(func=_create_token)

    revoke = sub.add_parser(
        "revoke-token", help="revoke an API token at once (by the token or by its id)",
        epilog="exit codes: 0 revoked (or already revoked); 1 no such token; 2 bad arguments")
    revoke.add_argument("token", metavar="TOKEN_OR_ID",
                        help="the token itself, or the id create-token printed")
    revoke.add_argument("--json", action="store_true", help="print the revoked token's row as JSON")
    revoke.set_defaults(func=_revoke_token)

    prune = sub.add_parser(
        "prune-idempotency-keys",
        help="delete Idempotency-Key records older than 24 h (they are ignored already)")
    prune.add_argument("--json", action="store_true", help='print {"deleted": N}')
    prune.set_defaults(func=_prune_keys)

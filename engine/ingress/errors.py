"""API errors: every refusal is `{"error": {"code", "message"}}` with a 4xx (or 503 when the
database cannot commit) and writes nothing."""

from __future__ import annotations

import msgspec

from engine.ingress.schemas import ErrorBody, ErrorDetail


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers

    def body(self) -> bytes:
        return msgspec.json.encode(ErrorBody(ErrorDetail(self.code, self.message)))


def bad_json(message: str) -> ApiError:
    return ApiError(400, "malformed_json", message)


def unauthorized() -> ApiError:
    return ApiError(
        401, "unauthorized", "a valid bearer token is required",
        [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
    )


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


def not_found(what: str = "resource") -> ApiError:
    return ApiError(404, "not_found", f"{what} not found")


def method_not_allowed(method: str, allowed: list[str]) -> ApiError:
    return ApiError(
        405, "method_not_allowed", f"method {method} is not allowed here",
        [(b"content-type", b"application/json"), (b"allow", ", ".join(allowed).encode())],
    )


def conflict(message: str) -> ApiError:
    return ApiError(409, "conflict", message)


def too_large(limit: int) -> ApiError:
    return ApiError(413, "payload_too_large", f"request body is over {limit} bytes")


def invalid(message: str) -> ApiError:
    return ApiError(422, "validation_error", message)


def unavailable(message: str = "the database cannot commit right now") -> ApiError:
    return ApiError(503, "unavailable", message)


def internal() -> ApiError:
    return ApiError(500, "internal_error", "internal server error")

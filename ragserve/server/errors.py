"""The one error shape every endpoint returns: ``{"error": {"status", "code", "field", "message"}}``."""
from __future__ import annotations

from flask import Response, jsonify

from ragserve.server.config import ServerConfig


class ApiError(Exception):
    """An error the client should see; ``field`` names the offending request field when there is one."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers or {}

    def to_dict(self) -> dict:
        err = {"status": self.status, "code": self.code, "message": self.message}
        if self.field is not None:
            err["field"] = self.field
        return {"error": err}

    def response(self) -> Response:
        resp = jsonify(self.to_dict())
        resp.status_code = self.status
        for k, v in self.headers.items():
            resp.headers[k] = v
        return resp


def invalid(field: str, message: str) -> ApiError:
    return ApiError(400, "invalid_field", message, field=field)


def unauthorized() -> ApiError:
    return ApiError(401, "unauthorized", "missing or wrong API key: send 'Authorization: Bearer <key>'",
                    field="Authorization", headers={"WWW-Authenticate": 'Bearer realm="ragserve"'})


def body_too_large(config: ServerConfig) -> ApiError:
    return ApiError(413, "body_too_large", f"request body is larger than {config.max_body_bytes} bytes", field="body")

"""Bearer-token check and the loopback test that decides whether a bind needs a token."""
from __future__ import annotations

import hmac
import ipaddress
import socket


def bearer_matches(authorization: str | None, api_key: str) -> bool:
    """``Authorization: Bearer <key>``, compared in constant time."""
    if not authorization:
        return False
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode("utf-8", "surrogateescape"), api_key.encode("utf-8"))


def is_loopback_host(host: str) -> bool:
    """True when every address ``host`` resolves to is a loopback address (127.0.0.0/8, ::1)."""
    h = host.strip("[]")
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(h, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)

"""Who may reach a local server (`tunelab ui`, `tunelab serve`), decided the same way for both: loopback by default;
any other host needs a key (given, or generated and printed at start), compared in constant time; without a key a
request must name a loopback Host, so a DNS-rebinding page cannot reach the server. And the one-line refusal of a
port that is taken, before a server starts. Torch-free and server-free."""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket

from .errors import TunelabError

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def access_token(host: str, given: str | None, flag: str = "--token") -> str | None:
    """The key requests must carry: the one given; on a non-loopback host without one, a new random one."""
    if given is not None and not given.strip():
        raise TunelabError(f"{flag} is empty; give a key or leave {flag} out")
    if given is None and not is_loopback(host):
        return secrets.token_urlsafe(24)
    return given


def key_matches(given: str | None, key: str) -> bool:
    """Whether `given` is `key`, compared in constant time."""
    return hmac.compare_digest((given or "").encode(), key.encode())


def host_name(header: str) -> str:
    """The Host header without its port: `127.0.0.1:7860` -> `127.0.0.1`, `[::1]:7860` -> `[::1]`."""
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0]


def loopback_refusal(host_header: str) -> str | None:
    """Without a key: the refusal of a request whose Host is not a loopback name, else None."""
    host = host_name(host_header)
    return None if host in LOOPBACK_HOSTS else f"refused: Host {host!r} is not this machine's loopback address"


def check_port(host: str, port: int) -> None:
    """Fail with one line, before the server starts, when the address is taken or not this machine's."""
    if not 0 < port < 65536:
        raise TunelabError(f"--port {port}: must be in 1..65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        try:
            s.bind((host.strip("[]"), port))
        except socket.gaierror as e:
            raise TunelabError(f"--host {host}: unknown host ({e})") from None
        except OSError as e:
            raise TunelabError(
                f"--host {host} --port {port}: cannot listen there ({e.strerror}); pick another --port"
            ) from None


def shown_host(host: str) -> str:
    """`host` as a URL writes it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host

"""The only way Hearthside talks to a model hub: guarded GET requests.

SECURITY.md promises https only, hub hosts only, no IP literals and no redirects to private or
loopback addresses. So this module builds its own connections with the standard library:
every URL (the first one and every redirect, at most MAX_REDIRECTS) is checked before a byte is
sent, the host name is resolved here and *every* address it has must be public, and the socket
is then opened to one of exactly those addresses (TLS still verifies the name), so a DNS answer
that changes between the check and the connect (rebinding) cannot slip in.

Plain http is possible for one case only: tests point `hub_endpoint` at a server on a loopback
IP literal and set `hub_allow_insecure_loopback`. The flag does nothing for any other host, so
no configuration can switch https off for a real network address.

HTTP proxies are not used: a proxy would resolve the names itself and the checks above would
be void.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import json
import re
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hearthside.core.errors import HearthsideError
from hearthside.core.settings import Settings

MAX_REDIRECTS = 5
CONNECT_TIMEOUT_S = 15.0
READ_TIMEOUT_S = 60.0
MAX_JSON_BYTES = 64 * 1024 * 1024
USER_AGENT = "hearthside (+https://github.com/hearthside)"

# Where huggingface.co sends LFS downloads (its resolve URLs answer 302 with one of these).
_HUB_CDN_HOST_PATTERNS = (
    re.compile(r"cdn-lfs(?:-[a-z0-9]{1,63}){0,8}\.(?:hf\.co|huggingface\.co)"),  # DNS labels
    re.compile(r"cas-bridge\.xethub\.hf\.co"),
)
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")

_CONNECTION_HINT = (
    "Check your internet connection, then run the same command again: a download resumes "
    "where it stopped."
)

Resolver = Callable[[str, int], Sequence[str]]


class HubError(HearthsideError):
    """The model hub could not be reached, refused a request, or answered something unusable."""


class UnsafeURLError(HubError):
    """A URL (or a redirect) points somewhere Hearthside never downloads from."""


# --- the endpoint ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HubEndpoint:
    """The hub's base URL and how strictly to treat it; checked when made."""

    url: str = "https://huggingface.co"
    allow_insecure_loopback: bool = False
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.username or parts.password or parts.query or parts.fragment:
            raise _bad_endpoint(self.url, "it may only be a scheme and a host name")
        if parts.path not in ("", "/"):
            raise _bad_endpoint(self.url, "it may not contain a path")
        if not parts.hostname:
            raise _bad_endpoint(self.url, "it has no host name")
        if parts.scheme == "https" and _ip_literal(parts.hostname) is None:
            object.__setattr__(self, "url", f"https://{parts.netloc.lower()}")
            return
        if parts.scheme == "http" and self.is_test_endpoint_host(parts.hostname):
            object.__setattr__(self, "url", f"http://{parts.netloc.lower()}")
            return
        raise _bad_endpoint(self.url, "it must be https:// and a host name, not an IP address")

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> HubEndpoint:
        chosen = settings if settings is not None else Settings()
        token = chosen.hub_token.get_secret_value() if chosen.hub_token is not None else None
        return cls(
            url=chosen.hub_endpoint,
            allow_insecure_loopback=chosen.hub_allow_insecure_loopback,
            token=token or None,
        )

    @property
    def scheme(self) -> str:
        return urllib.parse.urlsplit(self.url).scheme

    @property
    def netloc(self) -> str:
        return urllib.parse.urlsplit(self.url).netloc

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or ""

    @property
    def is_insecure_test_endpoint(self) -> bool:
        return self.scheme == "http"

    def is_test_endpoint_host(self, host: str) -> bool:
        address = _ip_literal(host)
        return self.allow_insecure_loopback and address is not None and address.is_loopback

    def api_url(self, path: str, params: Mapping[str, str | int | Sequence[str]] | None) -> str:
        query = urllib.parse.urlencode(params or {}, doseq=True)
        return f"{self.url}{path}" + (f"?{query}" if query else "")


def _bad_endpoint(url: str, why: str) -> UnsafeURLError:
    return UnsafeURLError(
        f"The hub address {_shown(url)} is not allowed: {why}.",
        hint="Set HEARTHSIDE_HUB_ENDPOINT to an https:// address such as https://huggingface.co.",
    )


# --- checking one URL ------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckedURL:
    """A URL that passed every rule, with the addresses its socket may connect to."""

    url: str
    scheme: str
    host: str
    port: int
    request_target: str  # path and query, as sent in the request line
    addresses: tuple[str, ...]
    is_endpoint: bool  # same scheme, host and port as the hub endpoint (gets the token)


def check_url(url: str, endpoint: HubEndpoint, resolve: Resolver | None = None) -> CheckedURL:
    """Refuse a URL Hearthside must not fetch; otherwise return where to connect.

    `resolve` maps (host, port) to IP address strings; the default asks the system resolver.
    """
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host or parts.username or parts.password:
        raise _refused(url, "it is not a plain web address")
    port = _port_of(parts, url)
    is_endpoint = parts.scheme == endpoint.scheme and _netloc(host, port) == _endpoint_netloc(
        endpoint
    )
    if parts.scheme != "https" and not (is_endpoint and endpoint.is_insecure_test_endpoint):
        raise _refused(url, "only https:// downloads are allowed")
    target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    if is_endpoint and endpoint.is_test_endpoint_host(host):
        return CheckedURL(url, parts.scheme, host, port, target, (host,), True)
    if _ip_literal(host) is not None:
        raise _refused(url, "it names an IP address instead of the hub")
    if not (host == endpoint.host or _is_hub_cdn_host(host)):
        raise _refused(url, f"{_shown(host)} is not the model hub or its download servers")
    addresses = _public_addresses(host, port, url, resolve or _system_resolve)
    return CheckedURL(url, parts.scheme, host, port, target, addresses, is_endpoint)


def _port_of(parts: urllib.parse.SplitResult, url: str) -> int:
    try:
        explicit = parts.port
    except ValueError:
        raise _refused(url, "its port is not a number") from None
    if explicit is not None:
        return explicit
    return 443 if parts.scheme == "https" else 80


def _netloc(host: str, port: int) -> str:
    return f"{host}:{port}"


def _endpoint_netloc(endpoint: HubEndpoint) -> str:
    parts = urllib.parse.urlsplit(endpoint.url)
    return _netloc(endpoint.host, parts.port or (443 if parts.scheme == "https" else 80))


def _is_hub_cdn_host(host: str) -> bool:
    return any(pattern.fullmatch(host) for pattern in _HUB_CDN_HOST_PATTERNS)


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _system_resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _public_addresses(host: str, port: int, url: str, resolve: Resolver) -> tuple[str, ...]:
    try:
        addresses = tuple(dict.fromkeys(resolve(host, port)))
    except OSError as exc:
        raise HubError(
            f"Could not find the address of {_shown(host)}.", hint=_CONNECTION_HINT
        ) from exc
    if not addresses:
        raise HubError(f"Could not find the address of {_shown(host)}.", hint=_CONNECTION_HINT)
    for address in addresses:
        if not _is_public(address):
            raise _refused(url, f"{_shown(host)} resolves to a private or local address")
    return addresses


def _is_public(address: str) -> bool:
    ip = _ip_literal(address.split("%", 1)[0])
    if ip is None:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _refused(url: str, why: str) -> UnsafeURLError:
    return UnsafeURLError(
        f"Hearthside refused to download from {_shown(url)}: {why}.",
        hint="Downloads come only from the model hub over https. If you set "
        "HEARTHSIDE_HUB_ENDPOINT, check it.",
    )


def _shown(text: str) -> str:
    printable = "".join(ch if ch.isprintable() else "?" for ch in text)
    return printable if len(printable) <= 120 else printable[:117] + "..."


# --- requests --------------------------------------------------------------------------------


class HubResponse:
    """An open response whose URL and every redirect before it passed `check_url`."""

    def __init__(
        self,
        sent: SentRequest,
        url: str,
        linked_headers: Mapping[str, str],
    ) -> None:
        self._connection = sent.connection
        self._socket = sent.socket
        self._response = sent.response
        response = sent.response
        self.url = url
        self.status = response.status
        self._linked = dict(linked_headers)

    def header(self, name: str) -> str | None:
        return self._response.getheader(name)

    @property
    def linked_sha256(self) -> str | None:
        """The LFS sha256 the hub announced on its resolve URL (X-Linked-Etag), if any."""
        etag = self._linked.get("x-linked-etag", "").strip().strip('"').removeprefix("W/")
        etag = etag.strip('"').lower()
        return etag if _SHA256_PATTERN.fullmatch(etag) else None

    def read(self, max_bytes: int) -> bytes:
        return self._response.read(max_bytes)

    def abort(self) -> None:
        """Unblock a read in another thread (used for cancelling)."""
        sock = self._socket
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed by the other side
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._response.close()
        self._connection.close()

    def __enter__(self) -> HubResponse:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def open_url(
    url: str,
    endpoint: HubEndpoint,
    *,
    headers: Mapping[str, str] | None = None,
    resolve: Resolver | None = None,
) -> HubResponse:
    """GET `url`, following at most MAX_REDIRECTS redirects, each one checked first."""
    linked: dict[str, str] = {}
    for _hop in range(MAX_REDIRECTS + 1):
        checked = check_url(url, endpoint, resolve)
        sent = send_checked(checked, endpoint, headers or {})
        _remember_linked_headers(sent.response, linked)
        if sent.response.status not in _REDIRECT_STATUSES:
            return HubResponse(sent, url, linked)
        location = sent.response.getheader("Location")
        sent.response.close()
        sent.connection.close()
        if not location:
            raise HubError("The hub sent a redirect without a destination.", hint=_RETRY_HINT)
        url = urllib.parse.urljoin(url, location)
    raise HubError(f"The hub redirected more than {MAX_REDIRECTS} times.", hint="Try again later.")


_RETRY_HINT = "Try again in a while; if it keeps happening, the hub may be having trouble."


def _remember_linked_headers(response: http.client.HTTPResponse, linked: dict[str, str]) -> None:
    for name in ("X-Linked-Etag", "X-Linked-Size"):
        value = response.getheader(name)
        if value is not None:
            linked[name.lower()] = value


@dataclass(frozen=True)
class SentRequest:
    connection: http.client.HTTPConnection
    response: http.client.HTTPResponse
    # http.client hands the socket to the response and forgets it when the server closes the
    # connection after this reply; keep it so a cancel can still shut it down.
    socket: socket.socket | None


def send_checked(
    checked: CheckedURL, endpoint: HubEndpoint, extra_headers: Mapping[str, str]
) -> SentRequest:
    """GET one URL that passed `check_url`, over a socket to one of its checked addresses."""
    connection = _connect(checked)
    headers = {"User-Agent": USER_AGENT, **extra_headers}
    if checked.is_endpoint and endpoint.token:
        headers["Authorization"] = f"Bearer {endpoint.token}"
    try:
        connection.request("GET", checked.request_target, headers=headers)
        sock = connection.sock
        return SentRequest(connection, connection.getresponse(), sock)
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise connection_error(checked.host, exc) from exc


def _connect(checked: CheckedURL) -> http.client.HTTPConnection:
    sock = _open_socket(checked)
    try:
        if checked.scheme == "https":
            context = ssl.create_default_context()
            tls = context.wrap_socket(sock, server_hostname=checked.host)
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                checked.host, checked.port, context=context, timeout=READ_TIMEOUT_S
            )
            connection.sock = tls
        else:
            connection = http.client.HTTPConnection(
                checked.host, checked.port, timeout=READ_TIMEOUT_S
            )
            connection.sock = sock
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        raise connection_error(checked.host, exc) from exc
    return connection


def _open_socket(checked: CheckedURL) -> socket.socket:
    last_error: OSError | None = None
    for address in checked.addresses:
        try:
            sock = socket.create_connection((address, checked.port), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            last_error = exc
            continue
        sock.settimeout(READ_TIMEOUT_S)
        return sock
    raise connection_error(checked.host, last_error or OSError("no address to connect to"))


def connection_error(host: str, exc: BaseException) -> HubError:
    detail = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return HubError(
        f"The connection to {_shown(host)} failed ({_shown(detail)}).", hint=_CONNECTION_HINT
    )


# --- status codes ----------------------------------------------------------------------------


def status_error(status: int, what: str) -> HubError:
    """A plain error for an HTTP status the caller did not expect."""
    if status in (401, 403):
        return HubError(
            f"The hub refused access to {what} (HTTP {status}).",
            hint="The repo may be private or gated: accept its licence on the hub's web page, "
            "then set HEARTHSIDE_HUB_TOKEN to an access token of your account.",
        )
    if status == 404:
        return HubError(
            f"The hub has no {what} (HTTP 404).",
            hint="Check the spelling; `hearthside models search WORDS` finds repos.",
        )
    if status == 429:
        return HubError(
            f"The hub is rate-limiting requests (HTTP 429) for {what}.",
            hint="Wait a few minutes, then run the same command again.",
        )
    return HubError(f"The hub answered HTTP {status} for {what}.", hint=_RETRY_HINT)


def get_json(
    endpoint: HubEndpoint,
    path: str,
    what: str,
    params: Mapping[str, str | int | Sequence[str]] | None = None,
    *,
    resolve: Resolver | None = None,
) -> Any:
    """GET an API path on the hub and parse its JSON body (capped at MAX_JSON_BYTES)."""
    with open_url(endpoint.api_url(path, params), endpoint, resolve=resolve) as response:
        if response.status != 200:
            raise status_error(response.status, what)
        try:
            body = response.read(MAX_JSON_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise connection_error(endpoint.host, exc) from exc
    if len(body) > MAX_JSON_BYTES:
        raise HubError(f"The hub's answer about {what} is too large.", hint=_RETRY_HINT)
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HubError(f"The hub's answer about {what} is not JSON.", hint=_RETRY_HINT) from exc

"""Where webhooks may go (SSRF): a model key chooses the URL, so the service must not POST to
its own network. A webhook's host must resolve only to public addresses, checked at
registration (422) and again at every delivery (DNS may change in between), and the request
goes to the address checked (no second resolution), with no redirect followed. The operator's
allowlist (``Settings.webhook_allow``: CIDRs, addresses, host names) admits chosen internal
targets."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class WebhookRefused(Exception):
    """The URL's target is not allowed; the message says why (no address of the target)."""


@dataclass(frozen=True)
class Allowlist:
    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()

    @staticmethod
    def parse(text: str) -> Allowlist:
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for entry in filter(None, (e.strip() for e in text.split(","))):
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(entry.lower().rstrip("."))
        return Allowlist(tuple(networks), frozenset(hosts))

    def admits(self, address: IPAddress) -> bool:
        return any(address in net for net in self.networks if net.version == address.version)


def why_internal(address: IPAddress) -> str | None:
    """Why a webhook may not go to this address (None: a public address). An IPv4-mapped or
    -translated IPv6 address is judged as the IPv4 address it carries."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour
        if inner is not None:
            return why_internal(inner)
    checks = (
        ("is_unspecified", "an unspecified address"),
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_multicast", "a multicast address"),
        ("is_reserved", "a reserved address"),
        ("is_private", "a private address"),
    )
    for prop, why in checks:
        if getattr(address, prop):
            return why
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return "a site-local address"
    if not address.is_global:
        return "not a public address"
    return None


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (an address literal: itself)."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise WebhookRefused("its host does not resolve") from exc
    out: list[IPAddress] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in out:
            out.append(address)
    if not out:
        raise WebhookRefused("its host does not resolve")
    return out


async def check(url: str, allow: Allowlist) -> list[IPAddress]:
    """The addresses to send ``url``'s request to (those its host resolves to), after checking
    every one. Raises WebhookRefused when the URL is not http(s) or any address is internal and
    not on the allowlist (a host name on the allowlist admits whatever it resolves to)."""
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise WebhookRefused("it must be an http or https URL with a host")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    addresses = await resolve(parsed.host, port)
    if parsed.host.lower().rstrip(".") in allow.hosts:
        return addresses
    for address in addresses:
        why = why_internal(address)
        if why is not None and not allow.admits(address):
            raise WebhookRefused(
                f"its host is (or resolves to) {why}; internal targets must be allowed by "
                "the operator (SELECTIVITY_WEBHOOK_ALLOW)"
            )
    return addresses


def pinned(url: str, address: IPAddress) -> tuple[str, dict[str, str], dict[str, str]]:
    """``url`` with its host replaced by the checked ``address`` (so that the connection goes
    where the check looked, whatever DNS says a moment later), the Host header it had, and the
    request extensions that keep TLS verifying the certificate for the original host name."""
    parsed = httpx.URL(url)
    host = parsed.host
    target = parsed.copy_with(host=str(address))
    extensions = {"sni_hostname": host} if parsed.scheme == "https" else {}
    return str(target), {"Host": parsed.netloc.decode("ascii")}, extensions

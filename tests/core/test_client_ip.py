"""apps.core.client_ip: X-Forwarded-For is believed only through TRUSTED_PROXIES, walked
from the right; the first untrusted address is the client."""

import pytest
from django.test import RequestFactory

from apps.core.client_ip import client_ip

PROXY = "10.0.0.2"


def ip_of(peer: str, forwarded: str | None = None) -> str | None:
    meta = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        meta["HTTP_X_FORWARDED_FOR"] = forwarded
    return client_ip(RequestFactory().get("/", **meta))


@pytest.fixture
def trusted(settings):
    settings.TRUSTED_PROXIES = [PROXY, "10.1.0.0/16", "fd00::/8"]


def test_it_trusts_nobody_by_default_and_ignores_the_header(settings):
    settings.TRUSTED_PROXIES = []
    assert ip_of("203.0.113.9", "198.51.100.7") == "203.0.113.9"


def test_it_ignores_the_header_from_a_peer_that_is_not_a_trusted_proxy(trusted):
    assert ip_of("203.0.113.9", "198.51.100.7") == "203.0.113.9"


def test_it_takes_the_address_a_trusted_proxy_appended(trusted):
    assert ip_of(PROXY, "198.51.100.7") == "198.51.100.7"


def test_it_skips_a_forged_prefix_and_names_the_first_untrusted_from_the_right(trusted):
    # the client sent "1.2.3.4"; the proxy appended the address it saw
    assert ip_of(PROXY, "1.2.3.4, 198.51.100.7") == "198.51.100.7"


def test_it_walks_past_a_chain_of_trusted_proxies(trusted):
    assert ip_of(PROXY, "1.2.3.4, 198.51.100.7, 10.1.4.5, 10.1.9.9") == "198.51.100.7"


def test_it_names_the_leftmost_hop_when_every_hop_is_trusted(trusted):
    assert ip_of(PROXY, "10.1.4.5") == "10.1.4.5"
    assert ip_of(PROXY) == PROXY  # a proxy's own request (a health check)


def test_it_stops_at_an_entry_that_is_not_an_address(trusted):
    assert ip_of(PROXY, "198.51.100.7, unknown, 10.1.4.5") == "10.1.4.5"
    assert ip_of(PROXY, "") == PROXY


def test_it_reads_ipv6_and_ipv4_mapped_peers(trusted):
    assert ip_of("fd00::1", "2001:db8::7") == "2001:db8::7"
    assert ip_of(f"::ffff:{PROXY}", "198.51.100.7") == "198.51.100.7"
    assert ip_of("::ffff:203.0.113.9", "198.51.100.7") == "203.0.113.9"


def test_it_answers_none_for_a_peer_that_is_no_address(trusted):
    assert ip_of("", "198.51.100.7") is None

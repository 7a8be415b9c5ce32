"""Lockouts (django-axes) and audit entries name the client, not a proxy, and never an
address the client made up: X-Forwarded-For counts only from TRUSTED_PROXIES."""

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.test import Client

from apps.audit.models import AuditEntry
from tests.access.conftest import PASSWORD, client_of, user_with
from tests.access.test_read_scoping import alert_in

pytestmark = pytest.mark.django_db
PROXY = "10.0.0.2"
VICTIM, ATTACKER = "198.51.100.8", "198.51.100.66"


@pytest.fixture(autouse=True)
def trusted_proxy(settings):
    settings.TRUSTED_PROXIES = [PROXY]


def log_in(password: str, peer: str, forwarded: str | None = None) -> int:
    meta = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        meta["HTTP_X_FORWARDED_FOR"] = forwarded
    answer = Client(**meta).post("/accounts/login/", {"username": "vera", "password": password})
    return answer.status_code


def locked_addresses() -> set[str]:
    return set(AccessAttempt.objects.values_list("ip_address", flat=True))


def test_a_forged_header_from_an_untrusted_peer_locks_out_only_that_peer(clusters):
    user_with("vera", alpha="viewer")
    for _ in range(settings.AXES_FAILURE_LIMIT):
        log_in("wrong", ATTACKER, forwarded=VICTIM)
    assert locked_addresses() == {ATTACKER}
    assert log_in(PASSWORD, ATTACKER, forwarded=VICTIM) == 429
    assert log_in(PASSWORD, VICTIM) == 302


def test_through_a_trusted_proxy_the_lockout_is_the_clients_not_everyones(clusters):
    user_with("vera", alpha="viewer")
    for _ in range(settings.AXES_FAILURE_LIMIT):
        # the attacker's own forged entry, then the address the proxy saw
        log_in("wrong", PROXY, forwarded=f"{VICTIM}, {ATTACKER}")
    assert locked_addresses() == {ATTACKER}
    assert log_in(PASSWORD, PROXY, forwarded=ATTACKER) == 429
    assert log_in(PASSWORD, PROXY, forwarded=VICTIM) == 302  # same proxy, another client


@pytest.mark.parametrize(
    ("peer", "forwarded", "recorded"),
    [
        (ATTACKER, VICTIM, ATTACKER),
        (PROXY, f"{VICTIM}, {ATTACKER}", ATTACKER),
        (PROXY, None, PROXY),
    ],
    ids=["untrusted-peer", "trusted-proxy", "proxy-itself"],
)
def test_audit_entries_record_the_client_address(clusters, peer, forwarded, recorded):
    alert = alert_in("alpha")
    meta = {"REMOTE_ADDR": peer, **({"HTTP_X_FORWARDED_FOR": forwarded} if forwarded else {})}
    answer = client_of(user_with("u", alpha="operator")).post(
        f"/api/v1/alerts/{alert.pk}/ack", {}, content_type="application/json", **meta
    )
    assert answer.status_code == 200, answer.content
    [entry] = AuditEntry.objects.filter(action="alert.acknowledge")
    assert entry.client_ip == recorded

"""The audit page and GET /api/v1/audit: cluster admins read their clusters' entries."""

import csv
import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from apps.audit.services import audit_record
from apps.clusters.models import Cluster
from tests.access.conftest import PASSWORD, client_of, user_with

pytestmark = pytest.mark.django_db


@pytest.fixture
def entries(clusters):
    """Three entries of this test's clusters (earlier tests' entries stay in the log: it
    refuses TRUNCATE, and the test flush keeps it)."""
    alpha, beta = Cluster.objects.get(name="alpha"), Cluster.objects.get(name="beta")
    return [
        audit_record(action="alert.acknowledge", outcome="denied", actor_name="vera",
                     cluster=alpha, target="alert:1", reason="=HYPERLINK(\"x\")"),
        audit_record(action="alert.acknowledge", outcome="succeeded", actor_name="op",
                     cluster=alpha, target="alert:1"),
        audit_record(action="alert.acknowledge", outcome="succeeded", actor_name="op",
                     cluster=beta, target="alert:2"),
    ]  # fmt: skip


def test_it_shows_an_admin_only_the_clusters_they_administer(entries):
    admin = client_of(user_with("ada", alpha="admin", beta="operator"))
    page = admin.get("/audit/").content.decode()
    assert "alert:1" in page and "alert:2" not in page
    denied = admin.get("/audit/?outcome=denied").content.decode()
    assert denied.count('<tr class="outcome-') == 1


def test_it_refuses_the_page_to_a_non_admin(entries):
    assert client_of(user_with("op2", alpha="operator")).get("/audit/").status_code == 403


def test_it_exports_csv_with_formulas_made_inert(entries):
    admin = client_of(user_with("ada", alpha="admin"))
    response = admin.get("/audit/?format=csv&actor=vera")
    assert response["Content-Type"] == "text/csv"
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0][:4] == ["at", "actor_kind", "actor_name", "action"]
    [row] = rows[1:]
    assert row[2] == "vera" and row[6].startswith("'=")


def test_it_serves_the_api_to_an_admin_by_personal_token(entries):
    user_with("ada", alpha="admin")
    out = io.StringIO()
    call_command("issue_user_token", "ada", stdout=out, stderr=io.StringIO())
    auth = {"Authorization": f"Bearer {out.getvalue().strip()}"}
    body = Client().get("/api/v1/audit?action=alert.acknowledge", headers=auth).json()
    assert [e["target"] for e in body["entries"]] == ["alert:1", "alert:1"]
    assert {e["cluster"] for e in body["entries"]} == {"alpha"}
    assert Client().get("/api/v1/audit", headers=auth | {}).status_code == 200


def test_it_refuses_the_api_to_a_viewer_and_shows_a_superuser_all(entries):
    viewer = client_of(user_with("vera", alpha="viewer"))
    assert viewer.get("/api/v1/audit").status_code == 403
    root = get_user_model().objects.create_superuser("root", password=PASSWORD)
    since = entries[0].at.timestamp()
    seen = client_of(root).get(f"/api/v1/audit?since={since}").json()["entries"]
    assert {entry.pk for entry in entries} <= {e["id"] for e in seen}
    assert {e["cluster"] for e in seen if e["id"] in {x.pk for x in entries}} == {"alpha", "beta"}

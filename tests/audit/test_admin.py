"""The audit log in the Django admin: listed, and offering no way to add, change or delete."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.audit.services import audit_record

pytestmark = pytest.mark.django_db


def test_the_admin_lists_entries_read_only():
    entry = audit_record(action="role.grant", outcome="succeeded", actor_name="manage.py")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(get_user_model().objects.create_superuser("root", password="pw-12345-x"))
    listing = client.get("/admin/audit/auditentry/")
    assert listing.status_code == 200 and "role.grant" in listing.content.decode()
    assert client.get("/admin/audit/auditentry/add/").status_code == 403
    page = client.get(f"/admin/audit/auditentry/{entry.pk}/change/").content.decode()
    assert 'name="_save"' not in page and "/delete/" not in page

from django.urls import path

from apps.access import views

urlpatterns = [path("audit/", views.audit_page, name="audit")]

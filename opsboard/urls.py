from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpResponse
from django.urls import include, path

from opsboard.api import api


def healthz(request):
    return HttpResponse("ok", content_type="text/plain")


urlpatterns = [
    path("api/v1/", api.urls),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", healthz),
    path("", include("apps.access.urls")),
    path("", include("apps.dashboard.urls")),
]

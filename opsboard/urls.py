from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpResponse, HttpResponseRedirect
from django.templatetags.static import static
from django.urls import include, path

from opsboard.api import api


def healthz(request):
    return HttpResponse("ok", content_type="text/plain")


def favicon(request):
    # Browsers and crawlers ask for /favicon.ico whatever a page's <link rel="icon"> says.
    # Not permanent: the target's name carries the file's hash and changes with it.
    return HttpResponseRedirect(static("favicon.svg"))


urlpatterns = [
    path("api/v1/", api.urls),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", healthz),
    path("favicon.ico", favicon),
    path("", include("apps.access.urls")),
    path("", include("apps.dashboard.urls")),
    path("", include("apps.commands.urls")),
]

"""ASGI entry point: HTTP through Django, websockets through Channels, and the agents'
long-poll (`GET /api/v1/commands` with an agent token) held as a coroutine in front of Django
(apps.commands.longpoll: one Redis subscription per process, no thread per poll).

Websockets accept only session-authenticated users (checked in the consumer) from an
origin in ALLOWED_HOSTS (AllowedHostsOriginValidator).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "opsboard.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs the app registry)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from apps.commands.longpoll import LongPollApp  # noqa: E402
from opsboard.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": LongPollApp(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)

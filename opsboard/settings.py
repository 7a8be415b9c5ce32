"""Opsboard settings: every value comes from the environment, with a sane default.

With no DATABASE_URL / REDIS_URL the embedded default (opsboard/embedded.py) starts a
real Postgres and Redis under ./var/. Postgres is the only database Opsboard supports.
"""

import ipaddress
from pathlib import Path

import dj_database_url

from apps.core.db_wait import BoundedConnection
from opsboard.env import env, envbool, envfloat, envint, envlist

BASE_DIR = Path(__file__).resolve().parent.parent


DEBUG = envbool("DEBUG", "false")
SECRET_KEY = env("SECRET_KEY") or (
    "insecure-dev-key-set-SECRET_KEY-in-production-0123456789abcdef" if DEBUG else ""
)
if not SECRET_KEY:
    # A fixed key must never reach production silently; a per-var-dir key keeps
    # sessions valid across restarts of the embedded default.
    from opsboard.embedded import var_dir

    _key_file = var_dir() / "secret_key"
    if not _key_file.exists():
        import secrets

        _key_file.write_text(secrets.token_urlsafe(64))
        _key_file.chmod(0o600)
    SECRET_KEY = _key_file.read_text().strip()

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "127.0.0.1,localhost")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    # the admin, each change made through it audited (apps/audit/admin_site.py)
    "apps.audit.admin_site.AuditedAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "channels",
    # ninja's templates and static: /api/v1/docs serves Swagger UI from our own files, not a CDN
    "ninja",
    "apps.core",
    "apps.clusters",
    "apps.runs",
    "apps.telemetry",
    "apps.ingest",
    "apps.live",
    "apps.alerts",
    "apps.evaluation",
    "apps.history",
    "apps.dashboard",
    "pgtrigger",
    "axes",
    "apps.access",
    "apps.audit",
    "apps.commands",
    "apps.metrics",
]

MIDDLEWARE = [
    # outermost: a request that found the database down is answered 503, never 500
    "apps.core.middleware.DatabaseUnavailableMiddleware",
    # /healthz, /readyz, /metrics: before the host check and the HTTPS redirect (pod probes)
    "apps.metrics.middleware.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "apps.ingest.middleware.IngestCountMiddleware",
    "apps.core.middleware.RequestSanityMiddleware",
    "apps.ingest.middleware.IngestBodyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "apps.live.middleware.LiveCSPMiddleware",
    # last, as django-axes asks: it turns a locked-out login into its lockout answer
    "axes.middleware.AxesMiddleware",
]

# The ingest pool (`OPSBOARD_ROLE=ingest`: the launcher's and compose's `ingest` gunicorn, to
# which the proxy sends POST /api/v1/ingest alone) serves that endpoint and /healthz only,
# through the middleware a bearer-token API needs: the rest (static files, sessions, CSRF,
# users, messages, frame and CSP headers, login throttling) cost a tenth of its CPU per batch
# and serve no agent. Anything else asked of it is answered 404 (IngestOnlyMiddleware).
OPSBOARD_ROLE = env("OPSBOARD_ROLE", "")
if OPSBOARD_ROLE == "ingest":
    MIDDLEWARE = [
        "apps.core.middleware.DatabaseUnavailableMiddleware",
        "apps.metrics.middleware.ProbeMiddleware",
        "django.middleware.security.SecurityMiddleware",
        "apps.ingest.middleware.IngestCountMiddleware",
        "apps.ingest.middleware.IngestOnlyMiddleware",
        "apps.core.middleware.RequestSanityMiddleware",
        "apps.ingest.middleware.IngestBodyMiddleware",
        "django.middleware.common.CommonMiddleware",
    ]
    # No CSRF, frame or login-throttling middleware: it takes no cookie, form or login and
    # renders no HTML. The admin's middleware neither: it never serves the admin.
    SILENCED_SYSTEM_CHECKS = [
        *("security.W003", "security.W002", "axes.W002"),
        *("admin.E408", "admin.E409", "admin.E410"),
    ]
elif OPSBOARD_ROLE:
    raise ValueError(f"OPSBOARD_ROLE={OPSBOARD_ROLE!r}: only 'ingest' (or unset) is known")

ROOT_URLCONF = "opsboard.urls"
WSGI_APPLICATION = "opsboard.wsgi.application"
ASGI_APPLICATION = "opsboard.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Services: Postgres and Redis, external or embedded --------------------------------
DATABASE_URL = env("DATABASE_URL")
if not DATABASE_URL:
    from opsboard.embedded import database_url

    DATABASE_URL = database_url()
# A connection pool, not persistent connections: under ASGI every request runs in a fresh
# thread, which would open (and close) a connection per request (≈ 5 ms each here).
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
if not DATABASES["default"]["ENGINE"].endswith("postgresql"):
    raise RuntimeError("Opsboard needs Postgres: DATABASE_URL must be a postgres:// URL")
DATABASES["default"].setdefault("OPTIONS", {})
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", envint("DB_CONNECT_TIMEOUT", 3))
DATABASES["default"]["OPTIONS"].setdefault(
    "pool",
    {
        "min_size": envint("DB_POOL_MIN", 1),
        "max_size": envint("DB_POOL_MAX", 8),
        # a dead database must give a fast 503, not a request that hangs for the pool
        "timeout": envfloat("DB_POOL_TIMEOUT", 2),
        # within a request, each wait for an answer is bounded (DB_REQUEST_TIMEOUT)
        "connection_class": BoundedConnection,
    },
)
# The longest an HTTP request waits for any one answer from Postgres (client side, so a frozen
# server too; 0: unbounded): past it, 503 + Retry-After (apps/core/db_wait.py, docs/faults.md).
DB_REQUEST_TIMEOUT = envfloat("DB_REQUEST_TIMEOUT", 5)
# Postgres's JIT compiled mid-size page reads for 10-270 ms each at 1,024 ranks, more than it
# saved (docs/performance-history.md); DB_JIT=true gives it back.
if not envbool("DB_JIT", "false"):
    DATABASES["default"]["OPTIONS"].setdefault("options", "-c jit=off")
DATABASES["default"]["TEST"] = {"NAME": env("TEST_DATABASE_NAME") or None}
# A streaming replica for the pages' and list APIs' reads (apps/core/db_router.py,
# docs/scaling.md): set DATABASE_REPLICA_URL, or OPSBOARD_EMBEDDED_REPLICA=1 on the embedded
# default. Same options and pool as the primary; never migrated; in tests a mirror of default.
DATABASE_REPLICA_URL = env("DATABASE_REPLICA_URL")
_embedded = not env("DATABASE_URL")
if not DATABASE_REPLICA_URL and _embedded and envbool("OPSBOARD_EMBEDDED_REPLICA", "false"):
    from opsboard.embedded import replica_url

    DATABASE_REPLICA_URL = replica_url()
if DATABASE_REPLICA_URL:
    _replica = dj_database_url.parse(DATABASE_REPLICA_URL, conn_max_age=0)
    _replica["OPTIONS"] = {**DATABASES["default"]["OPTIONS"], **_replica.get("OPTIONS", {})}
    DATABASES["replica"] = {**DATABASES["default"], **_replica, "TEST": {"MIRROR": "default"}}
    DATABASE_ROUTERS = ["apps.core.db_router.ReplicaRouter"]
    if OPSBOARD_ROLE != "ingest":  # the ingest pool reads nothing a page shows
        MIDDLEWARE.append("apps.core.db_router.ReplicaMiddleware")
# How long a client that wrote reads from the primary only (its own action in view).
REPLICA_STICKY_SECONDS = envint("REPLICA_STICKY_SECONDS", 10)
# The niceness `make run` starts the ingest pool and worker at (launcher/stack.py; 0: none).
# With DB_BACKEND_NICE (opt-in: the backends are the database server's processes; the
# launcher turns it on for the embedded Postgres it owns) a niced process renices its own
# Postgres backends alike, and the maintenance passes (rollups, compaction, pruning) run
# their database work at it, when the server runs on this host and allows it
# (apps/core/db_nice.py). With INGEST_SCHED_IDLE (Linux) all of them run in the idle
# scheduling class too.
INGEST_NICE = envint("INGEST_NICE", 10)
INGEST_SCHED_IDLE = envbool("INGEST_SCHED_IDLE", "true")
# The idle cpu cgroup the launcher runs ingest in (INGEST_IDLE_GROUP, launcher/cpu_group.py):
# the maintenance passes' backends join it too. Empty: none.
INGEST_IDLE_GROUP_PATH = env("INGEST_IDLE_GROUP_PATH", "")
DB_BACKEND_NICE = envbool("DB_BACKEND_NICE", "false")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env("REDIS_URL")
if not REDIS_URL:
    from opsboard.embedded import redis_url

    REDIS_URL = redis_url()

from opsboard.queues import REDIS_PREFIX  # noqa: E402 (keys, channels and queues share it)

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # A consumer waits on BZPOPMIN for 5 s at a time; redis-py's default 5 s socket
        # timeout cut that wait and dropped every websocket idle for 5 s (no close frame).
        # max_connections: each socket's connect takes one at once for its group_adds, and
        # redis-py's pool refuses the 101st (MaxConnectionsError, not a wait): 200 pages
        # reconnecting after a Redis restart crashed half their connects (docs/faults.md, 7).
        "CONFIG": {
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_timeout": 15,
                    "max_connections": envint("LIVE_REDIS_MAX_CONNECTIONS", 2000),
                }
            ],
            "prefix": f"{REDIS_PREFIX}:asgi",
        },
    }
}

# --- Celery ------------------------------------------------------------------------------
CELERY_BROKER_URL = REDIS_URL
from opsboard.queues import *  # noqa: E402, F403 (Celery's settings)
from opsboard.queues import CELERY_BEAT_SCHEDULE  # noqa: E402

# --- Opsboard's own: alerts, commands, history, ingest, live (opsboard/tunables.py) ------
from opsboard.tunables import *  # noqa: E402, F403
from opsboard.tunables import beat_schedule  # noqa: E402

CELERY_BEAT_SCHEDULE.update(beat_schedule)

# --- Web ---------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    # first, so that a locked-out username/IP is refused before the password is checked
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Login throttling (django-axes): after AXES_FAILURE_LIMIT failed logins for one username
# from one IP, that pair is locked out for AXES_COOLOFF_MINUTES. Per pair, not per IP, so
# one mistyping colleague behind a shared NAT does not lock out the others.
AXES_FAILURE_LIMIT = envint("AXES_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = envfloat("AXES_COOLOFF_MINUTES", 15.0) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_ENABLED = envbool("AXES_ENABLED", "true")
AXES_VERBOSE = False
# The proxies whose X-Forwarded-For is believed (addresses or CIDRs, comma-separated): the
# client is the first address, from the right, that is not one of them (apps.core.client_ip,
# for the lockouts above and the audit log). Empty: trust nobody, the peer is the client; a
# header from anyone else is ignored, so nobody can forge an address to lock a user out.
TRUSTED_PROXIES = envlist("TRUSTED_PROXIES", "")
for _proxy in TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError:
        raise ValueError(f"TRUSTED_PROXIES: {_proxy!r} is not an IP address or network") from None
AXES_CLIENT_IP_CALLABLE = "apps.core.client_ip.client_ip"
# Who may scrape /metrics (apps.metrics.auth, docs/operations.md): a bearer token
# (METRICS_TOKEN, or METRICS_TOKEN_FILE), or a client address in METRICS_ALLOWED_NETS
# (addresses or CIDRs, comma-separated; the client as apps.core.client_ip sees it). Neither
# set: nobody may.
METRICS_TOKEN = env("METRICS_TOKEN", "")
METRICS_ALLOWED_NETS = envlist("METRICS_ALLOWED_NETS", "")
for _net in METRICS_ALLOWED_NETS:
    try:
        ipaddress.ip_network(_net, strict=False)
    except ValueError:
        raise ValueError(
            f"METRICS_ALLOWED_NETS: {_net!r} is not an IP address or network"
        ) from None
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    # static/vendor/plotly.min.js from the installed plotly package (no CDN, no copy in git)
    "apps.dashboard.finders.PlotlyFinder",
]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG

SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", "false" if DEBUG else "true")
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_REDIRECT_EXEMPT = [r"^api/", r"^healthz$"]
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", "false" if DEBUG else "true")
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", "false" if DEBUG else "true")
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
# the directive only allows submission to the preload list; submitting is a separate step
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", "false" if DEBUG else "true")
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# django-csp. The pages have no inline script, handler or style attribute of their own.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        # 'self' covers ws:/wss: to the page's own host and port; the websocket's own port
        # (LIVE_WS_PORT) is added per request by apps.live.middleware.
        "connect-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        # Plotly.js injects a <style> element (style-src-elem) and sets style attributes
        # (style-src-attr) when it draws; both are refused without 'unsafe-inline' (seen in
        # Chromium: tests/test_csp.py). Inline *styles* cannot run code; scripts stay 'self'.
        "style-src": ["'self'", "'unsafe-inline'"],
        "font-src": ["'self'", "data:"],
        "frame-ancestors": ["'none'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["stderr"], "level": env("LOG_LEVEL", "INFO")},
}

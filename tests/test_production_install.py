"""The production image's steps work, without a Docker engine: the build context (the project
less what .dockerignore keeps out) is exported into an empty folder and installed there, not
editable, into a fresh virtual environment by docker/build.sh (the Dockerfile's RUN); then,
with DEBUG off and a real SECRET_KEY, `check --deploy` is clean, `migrate` runs as compose's
`migrate` service runs it, and gunicorn and uvicorn, started with compose's commands, serve
the login page, a static file from whitenoise's manifest, the OpenAPI schema and the live
websocket. A dependency missing from pyproject.toml, a package missing from the wheel or a
template or static file kept out of the context fails it."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
import yaml
from django.conf import settings
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = ROOT / "tests" / "artifacts" / "logs"
# Wheels of the dependencies, kept between runs: pip's own cache does not keep downloads on
# every machine, and a fresh install from the index costs a minute. A dependency missing from
# it is fetched (the install then runs from the index as the image's does).
WHEELHOUSE = Path(os.environ.get("OPSBOARD_WHEELHOUSE", Path.home() / ".cache/opsboard-wheels"))
PASSWORD = "install-check-" + secrets.token_hex(8)
pytestmark = pytest.mark.timeout(600)


# --- the build context -------------------------------------------------------------------
def dockerignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per .dockerignore line, in order; the last match wins."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        rules.append((negated, re.compile(_pattern_regex(pattern))))
    return rules


def _pattern_regex(pattern: str) -> str:
    """Docker's matching: `*` and `?` within one path segment, `**` across segments; a
    pattern that names a folder covers everything in it."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[" and "]" in pattern[i:]:
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return f"^{out}(?:/.*)?$"


def ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    verdict = False
    for negated, regex in rules:
        if regex.match(path):
            verdict = not negated
    return verdict


def export_context(source: Path, target: Path) -> None:
    """Copy what `docker build` would send: every file .dockerignore does not exclude."""
    rules = dockerignore_rules((source / ".dockerignore").read_text())
    # a folder can be skipped whole only when no `!` line could bring part of it back
    prunable = not any(negated for negated, _ in rules)
    for folder, dirs, files in os.walk(source):
        relative = Path(folder).relative_to(source)
        if prunable:
            dirs[:] = [d for d in dirs if not ignored((relative / d).as_posix(), rules)]
        for name in files:
            path = (relative / name).as_posix()
            if not ignored(path, rules):
                (target / relative).mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(folder) / name, target / path, follow_symlinks=False)


# --- the install -------------------------------------------------------------------------
def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{output}"
    return output


def base_env(venv: Path) -> dict[str, str]:
    """A clean environment: nothing of this checkout (PYTHONPATH, VIRTUAL_ENV) leaks in."""
    keep = ("HOME", "LANG", "LC_ALL", "TMPDIR", "PIP_CERT", "PIP_DEFAULT_TIMEOUT")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env["PATH"] = f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def build(context: Path, venv: Path) -> None:
    """docker/build.sh in the context, pip installing from the kept wheels; when a wheel is
    missing (a new or changed dependency) the wheels are fetched and the build runs again."""
    env = base_env(venv)
    offline = {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE)}
    done = subprocess.run(
        ["sh", "docker/build.sh"],
        cwd=context,
        env=offline,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode == 0:
        return
    if "No matching distribution" not in done.stdout + done.stderr:
        raise AssertionError(f"docker/build.sh failed:\n{done.stdout}{done.stderr}")
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    pip = [str(venv / "bin/python"), "-m", "pip"]
    run([*pip, "wheel", "-q", "-w", str(WHEELHOUSE), ".", "setuptools>=69"], context, env, 600)
    for own in WHEELHOUSE.glob("opsboard-*.whl"):
        own.unlink()
    run(["sh", "docker/build.sh"], context, offline, 300)


@dataclass
class Install:
    context: Path
    venv: Path
    env: dict[str, str]

    def manage(self, *args: str, timeout: float = 120, **extra: str) -> str:
        command = [str(self.venv / "bin/python"), "manage.py", *args]
        return run(command, self.context, {**self.env, **extra}, timeout)


@pytest.fixture(scope="module")
def throwaway_database_url() -> Iterator[str]:
    url = urlsplit(settings.DATABASE_URL)
    name = f"opsboard_install_{uuid.uuid4().hex[:12]}"
    admin = urlunsplit(url._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield urlunsplit(url._replace(path=f"/{name}"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def install(tmp_path_factory, throwaway_database_url) -> Install:
    started = time.monotonic()
    context = tmp_path_factory.mktemp("context")
    export_context(ROOT, context)
    venv = tmp_path_factory.mktemp("image") / "venv"
    run([sys.executable, "-m", "venv", str(venv)], context, base_env(venv), 120)
    build(context, venv)
    env = {
        **base_env(venv),
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(64),
        "DATABASE_URL": throwaway_database_url,
        "REDIS_URL": settings.REDIS_URL,
        "OPSBOARD_REDIS_PREFIX": f"{settings.REDIS_PREFIX}-install",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    print(f"exported and built in {time.monotonic() - started:.0f} s")
    return Install(context=context, venv=venv, env=env)


# --- the servers, as compose starts them -------------------------------------------------
def compose_command(service: str) -> list[str]:
    compose = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    return list(compose["services"][service]["command"])


def on_loopback(command: list[str], port: int) -> list[str]:
    """compose's command, bound to a free loopback port (and 2 workers on a test machine)."""
    replaced = {"0.0.0.0:8000": f"127.0.0.1:{port}", "0.0.0.0": "127.0.0.1", "8001": str(port)}
    command = [replaced.get(arg, arg) for arg in command]
    if "--workers" in command:
        command[command.index("--workers") + 1] = "2"
    return command


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str, process: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{url}: the server exited\n{log.read_text()}"
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer in {timeout:.0f} s\n{log.read_text()}")


@dataclass
class Served:
    http: str
    ws: str
    install: Install


@pytest.fixture(scope="module")
def served(install) -> Iterator[Served]:
    install.manage(*compose_command("migrate")[2:], timeout=300)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    ports = {"web": free_port(), "ws": free_port()}
    processes = []
    try:
        for service, port in ports.items():
            log = LOG_DIR / f"install-{service}.log"
            command = on_loopback(compose_command(service), port)
            command[0] = str(install.venv / "bin" / command[0])
            with log.open("w") as out:
                process = subprocess.Popen(
                    command,
                    cwd=install.context,
                    env=install.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            processes.append(process)
            wait_for(f"http://127.0.0.1:{port}/healthz", process, log)
        yield Served(
            http=f"http://127.0.0.1:{ports['web']}",
            ws=f"ws://127.0.0.1:{ports['ws']}",
            install=install,
        )
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                # uvicorn waits on open sockets' tasks; the checks are done by now
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()


def https_get(url: str, **headers: str) -> httpx.Response:
    """As behind the TLS proxy (X-Forwarded-Proto), so that SSL redirect stays on."""
    return httpx.get(url, headers={"X-Forwarded-Proto": "https", **headers}, timeout=10)


# --- the checks --------------------------------------------------------------------------
def test_it_installs_every_package_into_the_environment_not_just_the_folder(install):
    # From another folder the checkout's copy cannot shadow the installed one.
    code = "import apps.alerts.models, detectors, opsboard_agent; print(detectors.__file__)"
    env = {**install.env, "DJANGO_SETTINGS_MODULE": "opsboard.settings"}
    command = [str(install.venv / "bin/python"), "-c", f"import django; django.setup(); {code}"]
    where = run(command, Path("/"), env, 60).strip().splitlines()[-1]
    assert where.startswith(str(install.venv)), where
    assert (Path(where).parent / "data/xid_catalog.csv").is_file(), "package data not installed"


def test_the_deploy_checks_are_clean_with_debug_off(install):
    output = install.manage("check", "--deploy", "--fail-level", "WARNING")
    assert "no issues" in output


def test_collectstatic_put_a_manifest_into_the_image(install):
    manifest = json.loads((install.context / "staticfiles/staticfiles.json").read_text())
    assert "css/opsboard.css" in manifest["paths"]
    assert "vendor/plotly.min.js" in manifest["paths"]


def test_gunicorn_serves_the_login_page_with_its_static_files(served):
    page = https_get(f"{served.http}/accounts/login/")
    assert page.status_code == 200, page.text[:2000]
    assert "max-age=" in page.headers["strict-transport-security"]
    manifest = json.loads((served.install.context / "staticfiles/staticfiles.json").read_text())
    hashed = manifest["paths"]["css/opsboard.css"]
    assert f'href="/static/{hashed}"' in page.text

    static = https_get(f"{served.http}/static/{hashed}", **{"Accept-Encoding": "gzip"})
    assert static.status_code == 200
    assert static.headers["content-encoding"] == "gzip"  # whitenoise's compressed copy
    assert "immutable" in static.headers["cache-control"]
    assert static.content == (ROOT / "static/css/opsboard.css").read_bytes()


def test_gunicorn_serves_the_openapi_schema(served):
    schema = https_get(f"{served.http}/api/v1/openapi.json")
    assert schema.status_code == 200
    assert "/api/v1/ingest" in schema.json()["paths"]


def test_uvicorn_refuses_an_anonymous_websocket(served):
    origin = "http://127.0.0.1"
    with pytest.raises(InvalidStatus) as refused:
        connect(f"{served.ws}/ws/clusters/alpha/", origin=origin, open_timeout=10)
    # the consumer closes before accepting (4401), which the server answers with a 403
    assert refused.value.response.status_code == 403


def test_uvicorn_sends_a_logged_in_operator_the_cluster_snapshot(served):
    served.install.manage("issue_token", "alpha")
    served.install.manage(
        "createsuperuser",
        "--noinput",
        "--username",
        "ops",
        "--email",
        "ops@example.com",
        DJANGO_SUPERUSER_PASSWORD=PASSWORD,
    )
    cookie = login(served.http, "ops", PASSWORD)
    with connect(
        f"{served.ws}/ws/clusters/alpha/",
        origin="http://127.0.0.1",
        additional_headers={"Cookie": cookie},
        open_timeout=10,
    ) as websocket:
        first = json.loads(websocket.recv(timeout=10))
    assert first["type"] == "snapshot"


def login(base: str, username: str, password: str) -> str:
    """The session cookie from the login form (cookies by hand: they are Secure)."""
    page = https_get(f"{base}/accounts/login/")
    csrf = page.cookies["csrftoken"]
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token, page.text[:2000]
    origin = "https://" + urlsplit(base).netloc
    answer = httpx.post(
        f"{base}/accounts/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token[1]},
        headers={
            "X-Forwarded-Proto": "https",
            "Origin": origin,
            "Referer": f"{origin}/accounts/login/",
            "Cookie": f"csrftoken={csrf}",
        },
        timeout=10,
    )
    assert answer.status_code == 302, answer.text[:2000]
    return f"sessionid={answer.cookies['sessionid']}"


def test_compose_starts_every_opsboard_process_after_migrate_on_healthy_services():
    services = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())["services"]
    assert services["migrate"]["command"][:3] == ["python", "manage.py", "migrate"]
    for name in ("postgres", "redis"):
        assert services[name]["healthcheck"]["test"], name
    redis = services["redis"]["command"]
    assert redis[redis.index("--appendonly") + 1] == "yes"
    assert redis[redis.index("--maxmemory-policy") + 1] == "noeviction"
    opsboard = [name for name, s in services.items() if "build" in s]
    assert {"web", "ingest", "ws", "worker", "periodic", "beat", "publisher"} <= set(opsboard)
    for name in opsboard:
        needs = services[name]["depends_on"]
        assert needs["postgres"]["condition"] == "service_healthy", name
        assert needs["redis"]["condition"] == "service_healthy", name
        if name != "migrate":
            assert needs["migrate"]["condition"] == "service_completed_successfully", name

"""The documentation cannot go stale or point outside the repository.

docs/api.md's endpoint table is checked against the schema the server serves
(/api/v1/openapi.json) both ways, and every endpoint the API docs name must be served; every
link in the Markdown files resolves inside the repository (a clone has no ../shared), and no
code reaches for a file beside the checkout."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
API_DOC = REPO / "docs" / "api.md"
CONTRACT = REPO / "docs" / "contract.md"
THIS = Path(__file__).resolve()

# A row of the table: | `GET /api/v1/series` | `node`, … | auth | 200, 400, 404 |
ROW = re.compile(
    r"^\| `(GET|POST|PUT|PATCH|DELETE) (/api/v1/[^`]*)` \|([^|]*)\|([^|]*)\|([^|]*)\|$"
)
# An endpoint named in prose: `GET /api/v1/runs/NAME?x=…`, `POST /api/v1/alerts/ID/ack`
MENTION = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE) (/api/v1/[^\s`?\[]*)")
# Answers the schema cannot show: the ingest body middleware refuses an unknown
# Content-Encoding before the view runs (apps/ingest/middleware.py).
ANSWERED_BEFORE_THE_VIEW = {("POST", "/api/v1/ingest"): {"415"}}

LINK = re.compile(r"\]\(([^)\s]+)\)")
# Where a file beside the checkout would be named: the old shared folder or a machine path.
OUTSIDE = re.compile(
    r"\.\./shared|/work/|shared/(?:contract|fixtures)|[\"']shared[\"']\s*/\s*[\"']fixtures"
)
SKIPPED_DIRS = {".git", ".venv", "var", "staticfiles", "build", "dist", "node_modules"}


def repo_files(suffix: str) -> list[Path]:
    """The project's files (tracked or new, not ignored) ending in `suffix`."""
    try:
        names = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout.split("\n")  # fmt: skip
        paths = [REPO / name for name in names if name.endswith(suffix)]
    except (OSError, subprocess.CalledProcessError):  # an export without .git
        paths = [
            path
            for path in REPO.rglob(f"*{suffix}")
            if not SKIPPED_DIRS & set(path.relative_to(REPO).parts)
        ]
    return sorted(path for path in paths if path.is_file())


def table() -> dict[tuple[str, str], tuple[set[str], set[str]]]:
    """(method, path) → (query parameters, answers) of the endpoint table in docs/api.md."""
    rows = {}
    for line in API_DOC.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line.strip())
        if match:
            method, path, params, _auth, answers = match.groups()
            rows[method, path] = (
                set(re.findall(r"`(\w+)`", params)),
                set(re.findall(r"\b[1-5]\d\d\b", answers)),
            )
    return rows


def served(client) -> dict[tuple[str, str], tuple[set[str], set[str]]]:
    schema = client.get("/api/v1/openapi.json").json()
    return {
        (method.upper(), path): (
            {p["name"] for p in operation.get("parameters", ()) if p["in"] == "query"},
            set(operation["responses"]),
        )
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
    }


def shape(path: str) -> str:
    """/api/v1/runs/{name} and /api/v1/runs/NAME alike: placeholders and names become `*`."""
    parts = path.rstrip("/.,;:").split("/")
    return "/".join("*" if re.fullmatch(r"\{\w+\}|<\w+>|[A-Z_]+", part) else part for part in parts)


def mentions(text: str) -> set[tuple[str, str]]:
    return {(method, shape(path)) for method, path in MENTION.findall(text)}


@pytest.fixture
def schema_endpoints(client, db):
    endpoints = served(client)
    assert ("POST", "/api/v1/ingest") in endpoints  # the schema answered, whole
    return endpoints


def test_the_endpoint_table_lists_exactly_the_served_operations(schema_endpoints):
    documented = table()
    missing = set(schema_endpoints) - set(documented)
    stale = set(documented) - set(schema_endpoints)
    assert not missing, f"served but not in docs/api.md's endpoint table: {sorted(missing)}"
    assert not stale, f"in docs/api.md's endpoint table but not served: {sorted(stale)}"


def test_each_row_names_exactly_the_query_parameters_the_schema_takes(schema_endpoints):
    for endpoint, (params, _) in table().items():
        assert params == schema_endpoints[endpoint][0], endpoint


def test_each_row_lists_exactly_the_answers_the_schema_documents(schema_endpoints):
    for endpoint, (_, answers) in table().items():
        expected = schema_endpoints[endpoint][1] | ANSWERED_BEFORE_THE_VIEW.get(endpoint, set())
        assert answers == expected, endpoint


def test_every_endpoint_the_api_docs_name_is_served(schema_endpoints):
    served_shapes = {(method, shape(path)) for method, path in schema_endpoints}
    text = API_DOC.read_text(encoding="utf-8")
    # A last section "Not served yet", when there is one, lists what v1 reserves but the
    # server does not serve yet.
    contract, _, reserved = CONTRACT.read_text(encoding="utf-8").partition("## Not served yet")
    named = mentions(text) | mentions(contract)
    assert named, "no endpoint found in the docs: has the wording changed?"
    assert not named - served_shapes, sorted(named - served_shapes)
    assert served_shapes <= mentions(contract), "the contract omits a served endpoint"
    not_yet = mentions(reserved)
    assert not not_yet & served_shapes, "served now: move it out of 'Not served yet'"


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+\s+(.*)$", markdown, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", repo_files(".md"), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_of_the_docs_resolves_inside_the_repository(doc):
    text = doc.read_text(encoding="utf-8")
    assert not OUTSIDE.search(text), f"{doc.name} names a path outside the repository"
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        assert resolved.is_relative_to(REPO), f"{target} leaves the repository"
        assert resolved.exists(), f"{target} does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved.read_text(encoding="utf-8")), target


def test_no_code_reaches_for_files_beside_the_checkout():
    files = [
        path
        for suffix in (".py", ".toml", ".cfg", ".yaml", ".yml", ".sh", "Makefile", "run")
        for path in repo_files(suffix)
        if path != THIS
    ]
    assert any(path.name == "conftest.py" for path in files)
    offenders = [
        str(path.relative_to(REPO))
        for path in files
        if OUTSIDE.search(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert offenders == []


def test_the_vendored_fixtures_carry_their_licences():
    fixtures = REPO / "tests" / "fixtures"
    readme = (fixtures / "README.md").read_text(encoding="utf-8")
    sources = sorted(p.name for p in fixtures.iterdir() if p.is_dir() and p.name != "LICENSES")
    assert sources  # the agent's scrape tests read these
    for source in sources:
        assert f"## {source}/" in readme, f"{source}/ has no provenance in tests/fixtures/README.md"
    assert "Apache License" in (fixtures / "LICENSES" / "Apache-2.0.txt").read_text()
    assert "Datadog" in (fixtures / "datadog-integrations-core" / "LICENSE").read_text()

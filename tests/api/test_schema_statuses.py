"""The answers every operation may give are declared in the served schema (found by the fuzz
test, tests/api/test_schemathesis.py: the readers answered an undeclared 401)."""

from django.test import Client


def operations(schema: dict) -> list[tuple[str, dict]]:
    return [
        (f"{method.upper()} {path}", operation)
        for path, methods in schema["paths"].items()
        for method, operation in methods.items()
    ]


def test_it_declares_the_401_of_every_operation_that_asks_for_credentials(db):
    schema = Client().get("/api/v1/openapi.json").json()
    undeclared = [
        label
        for label, operation in operations(schema)
        if operation.get("security") and "401" not in operation["responses"]
    ]
    assert undeclared == []


def test_a_reader_without_credentials_gets_the_declared_401(db):
    client = Client()
    schema = client.get("/api/v1/openapi.json").json()
    for path in ("/api/v1/runs/run-1", "/api/v1/runs/run-1/plan", "/api/v1/nodes/n/series"):
        response = client.get(path)
        assert response.status_code == 401, path
        assert response.json()["errors"][0]["loc"] == "Authorization"
        template = path.replace("run-1", "{name}").replace("/n/", "/{name}/")
        assert "401" in schema["paths"][template]["get"]["responses"]


def strings_without_pattern(node, where: str, components: dict, seen: set[str]) -> list[str]:
    """Every string in a request body's schema that does not carry a pattern (or an enum)."""
    if isinstance(node, list):
        return [
            found
            for index, item in enumerate(node)
            for found in strings_without_pattern(item, f"{where}[{index}]", components, seen)
        ]
    if not isinstance(node, dict):
        return []
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            return []
        seen.add(name)
        return strings_without_pattern(components[name], name, components, seen)
    found = []
    if node.get("type") == "string" and not {"pattern", "enum", "const", "format"} & set(node):
        found.append(where)
    for key, value in node.items():
        found += strings_without_pattern(value, f"{where}.{key}", components, seen)
    return found


def test_every_string_a_request_body_holds_is_bounded_against_nul(db):
    """Query strings and form fields are screened for NUL by apps.core.middleware; a JSON
    body is not, and Postgres refuses a NUL even in a WHERE clause: each string a body
    holds carries a pattern (a command's `cluster` did not, and the fuzzer found the 500)."""
    schema = Client().get("/api/v1/openapi.json").json()
    components = schema["components"]["schemas"]
    unbounded = [
        found
        for label, operation in operations(schema)
        for found in strings_without_pattern(
            operation.get("requestBody", {}), label, components, set()
        )
    ]
    assert unbounded == []

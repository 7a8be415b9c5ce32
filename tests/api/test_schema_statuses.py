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

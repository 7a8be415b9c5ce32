from tests.access.conftest import clusters  # noqa: F401  (the two-cluster fixture)

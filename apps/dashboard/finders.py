"""Serves Plotly.js from the installed `plotly` Python package as static/vendor/plotly.min.js.

The bundle (and its MIT licence) come from the package itself, so the page never needs a
CDN and the JS always matches the pinned `plotly` version; collectstatic copies it like
any other static file, and whitenoise serves it in production."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_JS = "vendor/plotly.min.js"
PLOTLY_LICENSE = "vendor/plotly.LICENSE.txt"


def _plotly_files() -> dict[str, Path]:
    files = {PLOTLY_JS: Path(plotly.__file__).parent / "package_data" / "plotly.min.js"}
    for entry in metadata.distribution("plotly").files or ():
        if entry.name.upper().startswith("LICENSE"):
            files[PLOTLY_LICENSE] = Path(entry.locate())
            break
    return files


class _SingleFileStorage(FileSystemStorage):
    """The package directory of one file, under the static path we give it."""

    def __init__(self, source: Path, name: str) -> None:
        super().__init__(location=str(source.parent))
        self.source, self.static_name = source, name

    def path(self, name: str) -> str:
        return str(self.source)


class PlotlyFinder(BaseFinder):
    def __init__(self, *args, **kwargs) -> None:
        self.files = _plotly_files()

    def check(self, **kwargs):
        missing = [name for name, path in self.files.items() if not path.is_file()]
        if not missing:
            return []
        from django.core.checks import Error

        return [Error(f"plotly package file missing: {', '.join(missing)}", id="dashboard.E001")]

    def find(self, path: str, find_all: bool = False, **kwargs):
        found = self.files.get(path)
        if found is None or not found.is_file():
            return [] if find_all else None
        return [str(found)] if find_all else str(found)

    def list(self, ignore_patterns):
        for name, source in self.files.items():
            if source.is_file():
                yield name, _SingleFileStorage(source, name)

"""Every figure of the dashboard, as a plain Plotly figure dict ({"data", "layout"}).

The page gets a chart's first figure through json_script; the chart endpoints answer the
same builder's output for another range as JSON, and as CSV flattened from the very same
traces (`figure_csv`), so an export holds exactly what the chart shows. Times on the x axes
are Unix milliseconds (Plotly's date axes read numbers as such).

By domain: `run` (the run page's charts), `ranks` (the heat-map of every rank; one rank
against its peers), `node` (the node page's), `alert` (an alert's evidence); what they share
is in `base`, the CSV export in `export`. The registries name each page's charts (the chart
endpoints' <chart>; bench/pages.py lists their URLs from them)."""

from __future__ import annotations

from apps.dashboard.charts.node import NODE_CHARTS
from apps.dashboard.charts.run import RUN_CHARTS

__all__ = ["NODE_CHARTS", "RUN_CHARTS"]

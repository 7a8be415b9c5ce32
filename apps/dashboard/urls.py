from django.urls import path

from apps.dashboard.views import alerts, fleet, incidents, node, overview, report, run

RUN = "clusters/<str:cluster>/runs/<str:run>/"
NODE = "clusters/<str:cluster>/nodes/<str:node>/"

urlpatterns = [
    path("", overview.home, name="home"),
    path("alerts/", alerts.alerts_page, name="alerts"),
    path("alerts/<int:alert_id>/ack", alerts.alert_ack, name="alert-ack"),
    path("alerts/<int:alert_id>/silence", alerts.alert_silence_form, name="alert-silence"),
    path("alerts/<int:alert_id>/", alerts.alert_detail, name="alert-detail"),
    path("incidents/", incidents.incidents_page, name="incidents"),
    path("incidents/<int:incident_id>/ack", incidents.incident_ack, name="incident-ack"),
    path("incidents/<int:incident_id>/", incidents.incident_detail, name="incident-detail"),
    path("fleet/", fleet.fleet_page, name="fleet"),
    path("fleet/ledger.json", fleet.fleet_page, {"fmt": "json"}, name="fleet-json"),
    path("fleet/ledger.csv", fleet.fleet_page, {"fmt": "csv"}, name="fleet-csv"),
    path("clusters/<str:cluster>/", overview.cluster_overview, name="cluster-overview"),
    path(RUN, run.run_detail, name="run-detail"),
    path(f"{RUN}ranks/<int:rank>/", run.rank_detail, name="rank-detail"),
    path(f"{RUN}report/", report.run_report_page, name="run-report"),
    path(f"{RUN}report.json", report.run_report_page, {"fmt": "json"}, name="run-report-json"),
    path(f"{RUN}report.md", report.run_report_page, {"fmt": "md"}, name="run-report-md"),
    path(NODE, node.node_detail, name="node-detail"),
]
for fmt in ("json", "csv"):
    urlpatterns += [
        path(
            f"{RUN}charts/<slug:chart>.{fmt}",
            run.run_chart,
            {"fmt": fmt},
            name=f"run-chart-{fmt}",
        ),
        path(
            f"{NODE}charts/<slug:chart>.{fmt}",
            node.node_chart,
            {"fmt": fmt},
            name=f"node-chart-{fmt}",
        ),
    ]

from django.urls import path

from apps.dashboard import views

RUN = "clusters/<str:cluster>/runs/<str:run>/"
NODE = "clusters/<str:cluster>/nodes/<str:node>/"

urlpatterns = [
    path("", views.home, name="home"),
    path("alerts/", views.alerts_page, name="alerts"),
    path("alerts/<int:alert_id>/ack", views.alert_ack, name="alert-ack"),
    path("clusters/<str:cluster>/", views.cluster_overview, name="cluster-overview"),
    path(RUN, views.run_detail, name="run-detail"),
    path(NODE, views.node_detail, name="node-detail"),
]
for fmt in ("json", "csv"):
    urlpatterns += [
        path(
            f"{RUN}charts/<slug:chart>.{fmt}",
            views.run_chart,
            {"fmt": fmt},
            name=f"run-chart-{fmt}",
        ),
        path(
            f"{NODE}charts/<slug:chart>.{fmt}",
            views.node_chart,
            {"fmt": fmt},
            name=f"node-chart-{fmt}",
        ),
    ]

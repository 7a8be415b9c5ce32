from django.urls import path

from apps.live import views

urlpatterns = [
    path("", views.home, name="home"),
    path("clusters/<str:cluster_name>/", views.cluster_nodes, name="cluster-nodes"),
]

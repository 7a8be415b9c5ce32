from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from apps.clusters.selectors import cluster_list
from apps.live.selectors import cluster_get, node_health_list


@login_required
def home(request: HttpRequest) -> HttpResponse:
    clusters = cluster_list()
    if len(clusters) == 1:
        return redirect("cluster-nodes", cluster_name=clusters[0].name)
    return render(request, "live/home.html", {"clusters": clusters})


@login_required
def cluster_nodes(request: HttpRequest, cluster_name: str) -> HttpResponse:
    cluster = cluster_get(name=cluster_name)
    if cluster is None:
        raise Http404("no such cluster")
    context = {
        "cluster": cluster,
        "nodes": node_health_list(cluster_id=cluster.id),
        "ws_port": settings.LIVE_WS_PORT,
    }
    return render(request, "live/cluster_nodes.html", context)

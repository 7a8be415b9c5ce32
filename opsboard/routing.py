from django.urls import path

from apps.live.consumers import ClusterLiveConsumer

websocket_urlpatterns = [
    path("ws/clusters/<str:cluster_name>/", ClusterLiveConsumer.as_asgi()),
]

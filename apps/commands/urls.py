from django.urls import path

from apps.commands import views

RUN = "clusters/<str:cluster>/runs/<str:run>/"
NODE = "clusters/<str:cluster>/nodes/<str:node>/"

urlpatterns = [
    path(f"{RUN}commands/<slug:kind>", views.run_command, name="run-command"),
    path(f"{RUN}commands.json", views.run_commands_json, name="run-commands-json"),
    path(f"{NODE}commands/<slug:kind>", views.node_command, name="node-command"),
    path(f"{NODE}commands.json", views.node_commands_json, name="node-commands-json"),
]

"""The dashboard pages (login required) and their chart endpoints (JSON and CSV), a module
per page: overview (home, a cluster), run (a run, one rank), node, alerts (the list, one
alert, acknowledge); what they share is in common."""

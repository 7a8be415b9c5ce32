// The live feed of the page's clusters: /ws/clusters/<name>/ sends a snapshot, then at most
// one message per LIVE_SOCKET_FLUSH_S (docs/api.md): a numbered delta with the newest state of
// each node that changed, and the alerts and commands that changed beside them, or a lone
// alert or command. It numbers its messages one after another and resyncs by itself; a gap
// in seq still asks for a resync. Each message is re-dispatched on `document`, in one task,
// as "opsboard:snapshot" / "opsboard:delta" / "opsboard:alert" / "opsboard:command" (one
// event per alert and per command) for the page's scripts.
(function () {
  "use strict";
  const config = JSON.parse(document.getElementById("live-config").textContent);
  const status = document.getElementById("live-status");
  const open = new Map();
  const sockets = new Map();
  let heldUntil = 0;
  // Reconnecting: the wait doubles from RETRY_FIRST_MS to RETRY_CAP_MS, each scaled by a
  // random 0.5-1.0 so that the pages a restart of Redis or of the server closed at one
  // instant do not all come back at one instant. The cap bounds how long a page shows stale
  // state once the server is back: docs/faults.md (7) holds it to 10 s with 200 pages.
  const RETRY_FIRST_MS = 500;
  const RETRY_CAP_MS = 4000;

  function showStatus() {
    const all = config.clusters.length > 0 && config.clusters.every((name) => open.get(name));
    const everConnected = open.size > 0;
    status.dataset.state = all ? "live" : everConnected ? "reconnecting" : "connecting";
    status.textContent = all ? "live" : everConnected ? "reconnecting…" : "connecting…";
  }

  function emit(name, detail) { document.dispatchEvent(new CustomEvent(`opsboard:${name}`, { detail })); }

  function socketUrl(cluster) {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const host = config.ws_port ? `${location.hostname}:${config.ws_port}` : location.host;
    return `${scheme}://${host}/ws/clusters/${encodeURIComponent(cluster)}/`;
  }

  function connect(cluster, retry) {
    let seq = null;
    const socket = new WebSocket(socketUrl(cluster));
    sockets.set(cluster, socket);
    socket.onopen = () => { retry = RETRY_FIRST_MS; open.set(cluster, true); showStatus(); };
    socket.onmessage = (message) => {
      const data = JSON.parse(message.data);
      if (data.type === "snapshot") {
        seq = data.seq;
        emit("snapshot", { cluster, nodes: data.nodes });
      } else if (data.type === "delta") {
        if (seq !== null && data.seq <= seq) return;  // already in the snapshot
        // Deltas carry whole node states: apply this one, and ask for what was missed.
        if (seq !== null && data.seq !== seq + 1) socket.send(JSON.stringify({ type: "resync" }));
        seq = data.seq;
        if (data.nodes.length) emit("delta", { cluster, nodes: data.nodes });
        (data.alerts || []).forEach((alert) => emit("alert", { cluster, alert }));
        (data.commands || []).forEach((command) => emit("command", { cluster, command }));
      } else if (data.type === "alert") {
        emit("alert", { cluster, alert: data.alert });
      } else if (data.type === "command") {
        emit("command", { cluster, command: data.command });
      }
    };
    socket.onclose = () => {
      open.set(cluster, false); showStatus();
      const wait = Math.max(retry * (0.5 + Math.random() / 2), heldUntil - Date.now());
      setTimeout(() => connect(cluster, Math.min(retry * 2, RETRY_CAP_MS)), wait);
    };
  }

  showStatus();
  config.clusters.forEach((cluster) => connect(cluster, RETRY_FIRST_MS));
  // drop(ms): close every socket as a network failure would, and stay offline at least `ms`
  // (they reconnect and resync from a snapshot). For tests and for trying it by hand.
  window.opsboardLive = {
    drop(ms = 0) { heldUntil = Date.now() + ms; sockets.forEach((socket) => socket.close()); },
  };
})();

// Live node table: snapshot on connect, numbered deltas after; a gap in seq asks for a resync.
(function () {
  "use strict";
  const script = document.getElementById("live-script");
  const cluster = script.dataset.cluster;
  const tbody = document.querySelector("#nodes tbody");
  const status = document.getElementById("live-status");
  const nodes = new Map();
  let seq = null;
  let retry = 500;

  function setStatus(state, text) { status.dataset.state = state; status.textContent = text; }

  function fmt(value, digits, unit) {
    return value === undefined || value === null ? "–" : value.toFixed(digits) + unit;
  }

  function summary(node) {
    const gpus = Object.entries(node.health).filter(([key]) => key !== "host").map(([, v]) => v);
    const host = node.health.host || {};
    const util = gpus.map((g) => g["gpu.util"]).filter((v) => v !== undefined);
    const temp = gpus.map((g) => g["gpu.temp_c"]).filter((v) => v !== undefined);
    let used = 0, total = 0;
    gpus.forEach((g) => { used += g["gpu.mem_used_bytes"] || 0; total += g["gpu.mem_total_bytes"] || 0; });
    return {
      util: util.length ? util.reduce((a, b) => a + b, 0) / util.length : null,
      temp: temp.length ? Math.max(...temp) : null,
      mem: total ? (100 * used) / total : null,
      cpu: host["host.cpu_util"],
      gpuCount: gpus.length,
    };
  }

  function health(node, s) {
    if (node.state === "down") return "down";
    if (s.temp !== null && s.temp >= 85) return "critical";
    if (s.mem !== null && s.mem >= 95) return "warning";
    return "ok";
  }

  function render(node) {
    let row = tbody.querySelector(`tr[data-node="${CSS.escape(node.node)}"]`);
    if (!row) { row = document.createElement("tr"); row.dataset.node = node.node; tbody.appendChild(row); }
    const s = summary(node);
    const seen = node.last_seen ? new Date(node.last_seen * 1000).toLocaleTimeString() : "never";
    const cells = [node.node, node.state, seen, String(node.gpus ?? s.gpuCount),
      fmt(s.util, 1, " %"), fmt(s.temp, 0, " °C"), fmt(s.mem, 1, " %"), fmt(s.cpu, 1, " %")];
    row.replaceChildren(...cells.map((text, i) => {
      const td = document.createElement("td"); td.textContent = text;
      td.className = ["name", "state", "seen", "gpus", "util", "temp", "mem", "cpu"][i];
      return td;
    }));
    row.dataset.health = health(node, s);
    row.dataset.util = s.util === null ? "" : String(s.util);
  }

  function apply(list) { list.forEach((node) => { nodes.set(node.node, node); render(node); }); }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const host = script.dataset.wsPort ? `${location.hostname}:${script.dataset.wsPort}` : location.host;
    const socket = new WebSocket(`${scheme}://${host}/ws/clusters/${encodeURIComponent(cluster)}/`);
    socket.onopen = () => { retry = 500; setStatus("live", "live"); };
    socket.onmessage = (message) => {
      const data = JSON.parse(message.data);
      if (data.type === "snapshot") { seq = data.seq; apply(data.nodes); return; }
      if (data.type === "delta") {
        if (seq !== null && data.seq <= seq) return;  // already in the snapshot
        if (seq !== null && data.seq !== seq + 1) { socket.send(JSON.stringify({ type: "resync" })); }
        seq = data.seq; apply(data.nodes);
      }
    };
    socket.onclose = () => {
      setStatus("reconnecting", "reconnecting…");
      setTimeout(connect, retry); retry = Math.min(retry * 2, 10000);
    };
  }

  apply(JSON.parse(document.getElementById("initial-nodes").textContent));
  connect();
})();

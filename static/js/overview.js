// GPU tiles coloured by health, live from the websocket: the cluster overview's grid (with
// counts and the state filter), or one node's tiles on its page. The colour rules mirror apps/dashboard/selectors/health.py (node_tiles, gpu_health); their
// thresholds come from the server in page-data.rules.
(function () {
  "use strict";
  const page = JSON.parse(document.getElementById("page-data").textContent);
  const rules = page.rules;
  // At most this many tiles per node, whatever a node claims (the server draws as many).
  const maxGpus = page.max_gpus;
  const grid = document.getElementById("node-grid");
  const nodes = new Map(page.nodes.map((node) => [node.node, node]));
  const alerts = new Map(page.alerts.map((alert) => [alert.id, alert]));
  const ORDER = ["ok", "warning", "critical", "down"];
  const OPEN = ["firing", "acknowledged"];

  function worse(a, b) { return ORDER.indexOf(a) >= ORDER.indexOf(b) ? a : b; }

  function gpuHealth(v) {
    const temp = v["gpu.temp_c"];
    if (temp !== undefined && temp >= rules.temp_critical_c) return "critical";
    if (temp !== undefined && temp >= rules.temp_warning_c) return "warning";
    const used = v["gpu.mem_used_bytes"], total = v["gpu.mem_total_bytes"];
    if (used !== undefined && total && used / total >= rules.mem_warning_ratio) return "warning";
    const throttle = v["gpu.throttle_reasons"];
    if (throttle !== undefined && (throttle & rules.throttle_warning_mask)) return "warning";
    return "ok";
  }

  // selectors.alert_colours_gpu: the GPU an alert names alone; none for a rank's alert whose
  // GPU is unknown; every GPU for a node-wide one.
  function coloursGpu(alert, gpu) {
    if (alert.gpu !== null && alert.gpu !== undefined) return alert.gpu === gpu;
    return alert.rank === null || alert.rank === undefined;
  }

  function tiles(node) {
    const now = Date.now() / 1000;
    const mine = [...alerts.values()].filter((a) => a.node === node.node && OPEN.includes(a.state));
    const silent = node.last_seen === null || now - node.last_seen > rules.silent_down_s;
    const down = node.state === "down" || silent || mine.some((a) => a.kind === "heartbeat");
    const cordoned = node.state === "cordoned" || node.state === "draining";
    const gpus = Object.keys(node.health).filter((k) => /^\d+$/.test(k)).map(Number);
    const claimed = Number.isInteger(node.gpus) ? node.gpus : 0;
    const count = Math.min(maxGpus, gpus.reduce((most, g) => Math.max(most, g + 1), claimed));
    const out = [];
    for (let gpu = 0; gpu < count; gpu++) {
      const values = node.health[String(gpu)];
      let state;
      if (down) state = "down";
      else if (cordoned) state = "cordoned";
      else if (!values) state = "nodata";
      else {
        state = gpuHealth(values);
        mine.filter((a) => coloursGpu(a, gpu)).forEach((a) => { state = worse(state, a.severity); });
      }
      out.push({ gpu, state, values: values || {} });
    }
    return out;
  }

  function describe(node, tile) {
    const v = tile.values, parts = [`${node.node} GPU ${tile.gpu}: ${tile.state}`];
    if (v["gpu.util"] !== undefined) parts.push(`${v["gpu.util"].toFixed(0)} %`);
    if (v["gpu.temp_c"] !== undefined) parts.push(`${v["gpu.temp_c"].toFixed(0)} °C`);
    return parts.join(" · ");
  }

  // The server's reversed URL of a node page, the name percent-encoded in place of the
  // placeholder (the last one: a cluster's own name could spell it too).
  function nodeHref(node) {
    const at = page.node_url.lastIndexOf(page.node_placeholder);
    return page.node_url.slice(0, at) + encodeURIComponent(node.node) +
      page.node_url.slice(at + page.node_placeholder.length);
  }

  function card(node) {
    const element = document.querySelector(`[data-node="${CSS.escape(node.node)}"]`);
    if (element || !grid) return element;  // a node page shows its own node only
    return newCard(node);
  }

  function newCard(node) {
    const element = document.createElement("div");
    element.className = "node-card"; element.dataset.node = node.node;
    const name = document.createElement("a");
    name.className = "node-name"; name.href = nodeHref(node); name.textContent = node.node; name.tabIndex = -1;
    const box = document.createElement("div"); box.className = "tiles";
    element.append(name, box);
    grid.appendChild(element);
    return element;
  }

  function render(node) {
    const element = card(node);
    if (!element) return;
    element.dataset.nodeState = node.state;
    badge(element, node);
    const box = element.classList.contains("tiles") ? element : element.querySelector(".tiles");
    tiles(node).forEach((tile) => {
      let a = box.children[tile.gpu];
      if (!a) { a = document.createElement("a"); a.className = "tile"; a.href = nodeHref(node); a.tabIndex = -1; box.appendChild(a); }
      a.dataset.gpu = String(tile.gpu); a.dataset.state = tile.state;
      a.title = describe(node, tile); a.setAttribute("aria-label", a.title);
    });
  }

  // Cordoned, draining and scheduler-drained nodes are out of run plans: a badge on the card
  // says which, and the reason (the operator's, or the scheduler's own words) goes under it.
  function badge(element, node) {
    if (!element.classList.contains("node-card")) return;
    let mark = element.querySelector(".node-badge");
    if (!mark) { mark = document.createElement("span"); mark.className = "node-badge"; element.querySelector(".node-name").after(mark); }
    const byScheduler = node.down_by === "scheduler";
    mark.dataset.nodeState = node.state; mark.dataset.downBy = node.down_by || "";
    mark.textContent = byScheduler ? "down in the scheduler" : node.state;
    mark.hidden = node.state !== "cordoned" && node.state !== "draining" && !byScheduler;
    let reason = element.querySelector(".node-reason");
    if (!reason) { reason = document.createElement("p"); reason.className = "node-reason"; element.querySelector(".tiles").after(reason); }
    reason.textContent = node.reason || ""; reason.title = node.reason || ""; reason.hidden = !node.reason;
  }

  function counts() {
    if (!grid) return;
    const states = [...nodes.values()].map((n) => n.state);
    document.getElementById("count-cordoned").textContent = states.filter((s) => s === "cordoned").length;
    document.getElementById("count-draining").textContent = states.filter((s) => s === "draining").length;
    document.getElementById("count-scheduler-down").textContent = [...nodes.values()].filter((n) => n.down_by === "scheduler").length;
    document.getElementById("count-gpus").textContent = grid.querySelectorAll(".tile").length;
    document.getElementById("count-healthy").textContent = grid.querySelectorAll('.tile[data-state="ok"]').length;
    document.getElementById("count-firing").textContent = [...alerts.values()].filter((a) => a.state === "firing").length;
  }

  function renderAll() { nodes.forEach(render); counts(); filterGrid(); }

  // a block's page (?block=) follows its own nodes only, not the cluster's others
  const only = page.only_shown ? new Set(page.nodes.map((node) => node.node)) : null;
  function apply(list) {
    list.forEach((node) => { if (!only || only.has(node.node)) { nodes.set(node.node, node); render(node); } });
    counts(); filterGrid();
  }

  // --- finding nodes: a text box (node or run name) and state chips; the grid is one tab
  // stop (a roving tabindex over the shown cards' names: arrows, Home, End) -------------
  const search = document.getElementById("node-search");
  const empty = document.getElementById("node-grid-empty");
  const shownCount = document.getElementById("node-shown");
  const runsOf = new Map(Object.entries(page.node_runs || {}));

  function cards() { return grid ? [...grid.querySelectorAll(".node-card")] : []; }

  function matches(element, text, state) {
    const name = element.dataset.node;
    const named = !text || name.toLowerCase().includes(text) ||
      (runsOf.get(name) || []).some((run) => run.toLowerCase().includes(text));
    return named && (!state || element.querySelector(`.tile[data-state="${state}"]`) !== null);
  }

  function filterGrid() {
    if (!grid || !search) return;
    const text = search.value.trim().toLowerCase(), state = grid.dataset.filter || "";
    const all = cards();
    let shown = 0;
    all.forEach((element) => { element.hidden = !matches(element, text, state); if (!element.hidden) shown++; });
    const terms = [search.value.trim(), state].filter(Boolean).map((term) => `'${term}'`);
    empty.hidden = shown > 0 || all.length === 0;
    empty.textContent = `No nodes match ${terms.join(" and ")}.`;
    shownCount.textContent = terms.length && all.length ? `${shown} of ${all.length} nodes` : "";
    rove(null);
  }

  function stops() { return cards().filter((element) => !element.hidden).map((element) => element.querySelector(".node-name")); }

  // Exactly one shown card's name is tabbable: `to` (when given), else the one that was.
  function rove(to) {
    const names = stops();
    const current = to || names.find((name) => name.tabIndex === 0) || names[0];
    grid.querySelectorAll(".node-name").forEach((name) => { name.tabIndex = name === current ? 0 : -1; });
    return current;
  }

  function columns(names) {
    const top = names.length ? names[0].offsetTop : 0;
    return Math.max(1, names.filter((name) => name.offsetTop === top).length);
  }

  if (grid) {
    grid.addEventListener("keydown", (event) => {
      const names = stops(), at = names.indexOf(document.activeElement);
      if (at < 0) return;
      const step = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: columns(names), ArrowUp: -columns(names) }[event.key];
      let next = step === undefined ? null : Math.min(names.length - 1, Math.max(0, at + step));
      if (event.key === "Home") next = 0;
      if (event.key === "End") next = names.length - 1;
      if (next === null) return;
      event.preventDefault();
      rove(names[next]).focus();
    });
    grid.addEventListener("focusin", (event) => { if (event.target.classList.contains("node-name")) rove(event.target); });
  }
  if (search) search.addEventListener("input", filterGrid);

  document.addEventListener("opsboard:snapshot", (event) => apply(event.detail.nodes));
  document.addEventListener("opsboard:delta", (event) => apply(event.detail.nodes));
  document.addEventListener("opsboard:alert", (event) => {
    alerts.set(event.detail.alert.id, event.detail.alert);
    renderAll();
  });
  document.querySelectorAll(".state-filter button").forEach((button) => {
    button.addEventListener("click", () => {
      grid.dataset.filter = button.dataset.filter;
      document.querySelectorAll(".state-filter button").forEach((b) => b.setAttribute("aria-pressed", String(b === button)));
      filterGrid();
    });
  });
  renderAll();
  setInterval(renderAll, 10000);  // a silent node turns "down" without any message
})();

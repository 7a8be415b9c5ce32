// GPU tiles coloured by health, live from the websocket: the cluster overview's grid (with
// counts and the state filter), or one node's tiles on its page. The colour rules mirror apps/dashboard/selectors/health.py (node_tiles, gpu_health); their
// thresholds come from the server in page-data.rules.
//
// A socket message (at most one per LIVE_SOCKET_FLUSH_S) is drawn in one pass: its events
// only note the newest state of each node, and one draw then writes each changed card once,
// only the attributes that changed, and the counts once. A visible page draws as soon as the
// message's events are dispatched (a microtask); a hidden one at its first animation frame
// once shown, however many messages came meanwhile (a node's newest state only).
(function () {
  "use strict";
  const page = JSON.parse(document.getElementById("page-data").textContent);
  const rules = page.rules;
  // At most this many tiles per node, whatever a node claims (the server draws as many).
  const maxGpus = page.max_gpus;
  // out of run plans by an operator's word (apps.clusters.choices.OUT_OF_PLANS)
  const OUT_OF_PLANS = new Set(["cordoned", "draining", "maintenance"]);
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

  // the open alerts of each node, built once per draw
  function openAlertsByNode() {
    const byNode = new Map();
    alerts.forEach((a) => {
      if (!OPEN.includes(a.state)) return;
      if (!byNode.has(a.node)) byNode.set(a.node, []);
      byNode.get(a.node).push(a);
    });
    return byNode;
  }

  function tiles(node, byNode) {
    const now = Date.now() / 1000;
    const mine = byNode.get(node.node) || [];
    const silent = node.last_seen === null || now - node.last_seen > rules.silent_down_s;
    const down = node.state === "down" || silent || mine.some((a) => a.kind === "heartbeat");
    const cordoned = OUT_OF_PLANS.has(node.state);
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

  // A node's card, found once (a querySelector per node per message scans 4,096 cards).
  const cardOf = new Map();
  function card(node) {
    let element = cardOf.get(node.node);
    if (element === null || (element && element.isConnected)) return element;
    element = document.querySelector(`[data-node="${CSS.escape(node.node)}"]`);
    if (!element && grid) element = newCard(node);
    cardOf.set(node.node, element);  // null: a node page shows its own node only
    return element;
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

  // Set what differs only: an unchanged attribute is not written (no style work for it).
  function set(element, name, value) {
    if (element.getAttribute(name) !== value) element.setAttribute(name, value);
  }

  // Draw one node's card; returns its card (null where the page has none).
  function render(node, byNode) {
    const element = card(node);
    if (!element) return null;
    set(element, "data-node-state", node.state);
    badge(element, node);
    const box = element.classList.contains("tiles") ? element : element.querySelector(".tiles");
    tiles(node, byNode).forEach((tile) => {
      let a = box.children[tile.gpu];
      if (!a) { a = document.createElement("a"); a.className = "tile"; a.href = nodeHref(node); a.tabIndex = -1; box.appendChild(a); }
      set(a, "data-gpu", String(tile.gpu)); set(a, "data-state", tile.state);
      const title = describe(node, tile);
      set(a, "title", title); set(a, "aria-label", title);
    });
    if (grid) {
      const shownTiles = box.querySelectorAll(".tile");
      let ok = 0;
      shownTiles.forEach((a) => { if (a.dataset.state === "ok") ok++; });
      tileCounts.set(node.node, { gpus: shownTiles.length, ok });
    }
    return element;
  }

  // Cordoned, draining and scheduler-drained nodes are out of run plans: a badge on the card
  // says which, and the reason (the operator's, or the scheduler's own words) goes under it.
  function badge(element, node) {
    if (!element.classList.contains("node-card")) return;
    let mark = element.querySelector(".node-badge");
    if (!mark) { mark = document.createElement("span"); mark.className = "node-badge"; element.querySelector(".node-name").after(mark); }
    const byScheduler = node.down_by === "scheduler";
    set(mark, "data-node-state", node.state); set(mark, "data-down-by", node.down_by || "");
    const text = byScheduler ? "down in the scheduler" : node.state;
    if (mark.textContent !== text) mark.textContent = text;
    const hidden = !OUT_OF_PLANS.has(node.state) && !byScheduler;
    if (mark.hidden !== hidden) mark.hidden = hidden;
    let reason = element.querySelector(".node-reason");
    if (!reason) { reason = document.createElement("p"); reason.className = "node-reason"; element.querySelector(".tiles").after(reason); }
    if (reason.textContent !== (node.reason || "")) reason.textContent = node.reason || "";
    set(reason, "title", node.reason || "");
    if (reason.hidden !== !node.reason) reason.hidden = !node.reason;
  }

  // the tiles each node's card shows, and how many are ok: the GPU counts without a
  // query over every tile of the grid
  const tileCounts = new Map();

  function count(id, value) {
    const element = document.getElementById(id);
    if (element.textContent !== String(value)) element.textContent = String(value);
  }

  function counts() {
    if (!grid) return;
    let cordoned = 0, draining = 0, maintenance = 0, schedulerDown = 0, gpus = 0, ok = 0, firing = 0;
    nodes.forEach((n) => {
      if (n.state === "cordoned") cordoned++;
      if (n.state === "draining") draining++;
      if (n.state === "maintenance") maintenance++;
      if (n.down_by === "scheduler") schedulerDown++;
    });
    tileCounts.forEach((c) => { gpus += c.gpus; ok += c.ok; });
    let unacknowledged = 0;
    alerts.forEach((a) => {
      if (a.state === "firing") firing++;
      if (a.state === "firing" && a.severity === "warning") unacknowledged++;
    });
    count("count-cordoned", cordoned); count("count-draining", draining);
    count("count-maintenance", maintenance);
    count("count-scheduler-down", schedulerDown); count("count-gpus", gpus);
    count("count-healthy", ok); count("count-firing", firing);
    count("count-unacknowledged", unacknowledged);
  }

  // a block's page (?block=) follows its own nodes only, not the cluster's others; a node's
  // page its own node
  const only = page.only_shown || !grid ? new Set(page.nodes.map((node) => node.node)) : null;
  const shown = (node) => !only || only.has(node.node);

  // What the next draw writes: the newest state of each node changed since the last one,
  // or every node (`whole`: a snapshot, the clock, the first draw).
  const pending = new Map();
  let whole = false, scheduled = false;

  function schedule() {
    if (scheduled) return;
    scheduled = true;
    if (document.hidden) requestAnimationFrame(draw); else queueMicrotask(draw);
  }

  function draw() {
    scheduled = false;
    const list = whole ? [...nodes.values()] : [...pending.values()];
    const all = whole;
    pending.clear(); whole = false;
    const byNode = openAlertsByNode();
    const changed = [];
    list.forEach((node) => { const element = render(node, byNode); if (element) changed.push(element); });
    counts();
    if (all) filterGrid(); else filterCards(changed);
  }

  function renderAll() { whole = true; schedule(); }

  // A delta: each node's newest state, drawn at the next draw.
  function apply(list) {
    list.forEach((node) => { if (shown(node)) { nodes.set(node.node, node); pending.set(node.node, node); } });
    schedule();
  }

  // A snapshot replaces what the page holds: a node it no longer names loses its card.
  function replace(list) {
    const fresh = new Map(list.filter(shown).map((node) => [node.node, node]));
    nodes.forEach((_, name) => {
      if (fresh.has(name)) return;
      const element = grid && (cardOf.get(name) || grid.querySelector(`[data-node="${CSS.escape(name)}"]`));
      if (element) element.remove();
      cardOf.delete(name); tileCounts.delete(name);
    });
    nodes.clear();
    fresh.forEach((node, name) => nodes.set(name, node));
    pending.clear();
    renderAll();
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
    let visible = 0;
    all.forEach((element) => {
      const hidden = !matches(element, text, state);
      if (element.hidden !== hidden) element.hidden = hidden;
      if (!hidden) visible++;
    });
    const terms = [search.value.trim(), state].filter(Boolean).map((term) => `'${term}'`);
    empty.hidden = visible > 0 || all.length === 0;
    empty.textContent = `No nodes match ${terms.join(" and ")}.`;
    shownCount.textContent = terms.length && all.length ? `${visible} of ${all.length} nodes` : "";
    rove(null);
  }

  // After a delta: only its cards can have come into or gone out of the filter; the whole
  // grid is filtered again only when one did (the counts and the tab stop follow).
  function filterCards(changed) {
    if (!grid || !search) return;
    const text = search.value.trim().toLowerCase(), state = grid.dataset.filter || "";
    const moved = changed.some((element) => element.hidden !== !matches(element, text, state));
    const current = grid.querySelector('.node-name[tabindex="0"]');
    if (moved || !current) filterGrid();
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

  document.addEventListener("opsboard:snapshot", (event) => replace(event.detail.nodes));
  document.addEventListener("opsboard:delta", (event) => apply(event.detail.nodes));
  document.addEventListener("opsboard:alert", (event) => {
    // an alert colours its own node's tiles only (and the firing count)
    const alert = event.detail.alert, node = nodes.get(alert.node);
    alerts.set(alert.id, alert);
    if (node) pending.set(node.node, node);
    schedule();
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

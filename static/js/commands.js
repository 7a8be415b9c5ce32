// A run's or a node's command list (table#commands-list) kept live: each "command" message of
// the page's cluster (rows as apps/commands/rows.py builds them) adds or updates its row, and
// each snapshot (the socket (re)connected) reloads the list from data-source, so a change
// missed while offline shows too. A state only moves forward (issued → delivered → accepted →
// succeeded | failed | expired): an older copy of a row never overwrites a newer one.
// On a node page the node's state (h1 #node-state) follows the live deltas.
(function () {
  "use strict";
  const table = document.getElementById("commands-list");
  if (!table) return;
  const body = table.tBodies[0];
  const scope = table.dataset.scope, name = table.dataset.scopeName;
  const ORDER = { issued: 0, delivered: 1, accepted: 2, succeeded: 3, failed: 3, expired: 3 };
  const CELLS = ["issued", "kind", "target", "state", "issued-by", "reason", "detail"];

  function mine(command) { return command.cluster === table.dataset.cluster && command[scope] === name; }

  function target(command) {
    return [command.run, command.node].filter((part) => part !== null).join(" on ");
  }

  // The issue time as the server draws it: <time data-zoned>, in the zone timezone.js picks
  // (and rewritten by it when the switch flips).
  function issued(command) {
    const ms = command.issued_at * 1000;
    const time = document.createElement("time");
    time.dataset.zoned = "";
    time.textContent = command.issued_at_text;
    if (Number.isFinite(ms)) {
      time.dateTime = new Date(ms).toISOString();
      if (window.opsboardZone) time.textContent = window.opsboardZone.format(ms).slice(0, 19);
    }
    return time;
  }

  function fill(row, command) {
    row.dataset.commandId = command.id; row.dataset.kind = command.kind; row.dataset.state = command.state;
    const text = {
      kind: command.kind, target: target(command), state: command.state,
      "issued-by": command.issued_by, reason: command.reason, detail: command.detail,
    };
    CELLS.forEach((cell, index) => {
      if (cell === "issued") row.cells[index].replaceChildren(issued(command));
      else row.cells[index].textContent = text[cell];
    });
  }

  function newRow(command) {
    const row = document.createElement("tr");
    CELLS.forEach((cell) => { const td = document.createElement("td"); td.className = cell; row.appendChild(td); });
    // newest first: before the first row issued earlier than this one
    const later = [...body.querySelectorAll("tr[data-command-id]")].find((r) => Number(r.dataset.issuedAt || Infinity) < command.issued_at);
    body.insertBefore(row, later || null);
    body.querySelectorAll("tr.empty").forEach((empty) => empty.remove());
    return row;
  }

  function apply(command) {
    if (!mine(command)) return;
    let row = body.querySelector(`tr[data-command-id="${CSS.escape(command.id)}"]`);
    if (row && ORDER[command.state] < ORDER[row.dataset.state]) return;  // an older copy
    if (!row) row = newRow(command);
    row.dataset.issuedAt = String(command.issued_at);
    fill(row, command);
  }

  function reload() {
    fetch(table.dataset.source, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then((response) => (response.ok ? response.json() : { commands: [] }))
      .then((data) => data.commands.slice().reverse().forEach(apply))
      .catch(() => {});  // the live messages still come; the next snapshot tries again
  }

  // The websocket carries every change, but a busy channel layer may drop a message (its
  // per-channel capacity) without the socket closing: while a command is still live, the
  // list is read again every RECHECK_MS as a safety net.
  const RECHECK_MS = 10000;
  const LIVE = new Set(["issued", "delivered", "accepted"]);
  setInterval(() => {
    const rows = body.querySelectorAll("tr[data-command-id]");
    if ([...rows].some((row) => LIVE.has(row.dataset.state))) reload();
  }, RECHECK_MS);

  document.addEventListener("opsboard:command", (event) => apply(event.detail.command));
  document.addEventListener("opsboard:snapshot", (event) => {
    if (event.detail.cluster === table.dataset.cluster) reload();
  });

  const nodeState = document.getElementById("node-state");
  function follow(event) {
    if (!nodeState || scope !== "node") return;
    const node = event.detail.nodes.find((n) => n.node === name);
    if (node) { nodeState.dataset.state = node.state; nodeState.textContent = node.state; }
  }
  document.addEventListener("opsboard:snapshot", follow);
  document.addEventListener("opsboard:delta", follow);
})();

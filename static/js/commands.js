// A run's or a node's command list (table#commands-list) kept live: each "command" message of
// the page's cluster (rows as apps/commands/rows.py builds them) adds or updates its row, and
// each snapshot (the socket (re)connected) reloads the list from data-source, so a change
// missed while offline shows too. A state only moves forward (issued → delivered → accepted →
// succeeded | failed | expired): an older copy of a row never overwrites a newer one.
// On a node page the node's state (h1 #node-state) follows the live deltas. On a run page the
// run's header (h1 #run-state, p#run-ended) follows a stop or resume: a command row that
// shows the run in another state reloads the list, which carries the run's header.
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

  const runState = scope === "run" ? document.getElementById("run-state") : null;
  const runEnded = document.getElementById("run-ended");
  // The header as the server draws it (templates/dashboard/run.html), from run-commands-json.
  function runFollow(run) {
    if (!runState) return;
    runState.dataset.state = run.state;
    runState.textContent = run.state;
    if (!runEnded) return;
    runEnded.hidden = run.ended_at === null;
    runEnded.dataset.state = run.state;
    runEnded.querySelector(".run-ended-state").textContent = run.state;
    runEnded.querySelector(".run-end-message").textContent = run.end_message ? `: ${run.end_message}` : "";
    const time = runEnded.querySelector("time");
    time.textContent = run.ended_at_text;
    if (run.ended_at !== null) {
      const ms = run.ended_at * 1000;
      time.dateTime = new Date(ms).toISOString();
      if (window.opsboardZone) time.textContent = window.opsboardZone.format(ms).slice(0, 19);
    }
  }

  // `follow`: a row that shows the run in another state than the header reloads the list
  // (not for the rows of a reload itself, which brought the header along).
  function apply(command, follow = true) {
    if (!mine(command)) return;
    if (follow && runState && command.run_state && command.run_state !== runState.dataset.state) reload();
    let row = body.querySelector(`tr[data-command-id="${CSS.escape(command.id)}"]`);
    if (row && ORDER[command.state] < ORDER[row.dataset.state]) return;  // an older copy
    if (!row) row = newRow(command);
    row.dataset.issuedAt = String(command.issued_at);
    fill(row, command);
  }

  function reload() {
    fetch(table.dataset.source, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then((response) => (response.ok ? response.json() : { commands: [] }))
      .then((data) => {
        if (data.run) runFollow(data.run);
        data.commands.slice().reverse().forEach((command) => apply(command, false));
      })
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
    if (!node) return;
    nodeState.dataset.state = node.state; nodeState.textContent = node.state;
    const reason = document.getElementById("node-reason");
    if (reason) {
      reason.hidden = !node.reason;
      reason.firstChild.textContent = node.down_by === "scheduler" ? "Down in the scheduler: " : "Out of run plans: ";
      reason.querySelector("span").textContent = node.reason || "";
    }
  }
  document.addEventListener("opsboard:snapshot", follow);
  document.addEventListener("opsboard:delta", follow);
})();

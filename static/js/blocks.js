// A fleet's overview (past OVERVIEW_NODE_CARDS nodes): blocks of nodes, each coloured by its
// worst GPU (apps/dashboard/selectors/blocks.py). The finder shows the blocks holding a node
// or run whose name contains the text, and those with a GPU in the picked state; a block
// opens its nodes' cards (?block=, live there). The page does not carry every node's health
// (megabytes at 4,096 nodes): it fetches itself again every REFRESH_MS and takes the new
// blocks and counts from it, so what it shows is what the server renders.
(function () {
  "use strict";
  const REFRESH_MS = 10000;
  const search = document.getElementById("block-search");
  const shownCount = document.getElementById("block-shown");
  const empty = document.getElementById("block-grid-empty");
  let grid = document.getElementById("block-grid");
  if (!grid || !search) return;

  function matches(block, text, state) {
    const named = !text || block.dataset.nodes.toLowerCase().includes(text) ||
      block.dataset.runs.toLowerCase().includes(text) || block.dataset.block.toLowerCase().includes(text);
    return named && (!state || block.dataset.states.split(" ").includes(state));
  }

  function filter() {
    const text = search.value.trim().toLowerCase(), state = grid.dataset.filter || "";
    const all = [...grid.querySelectorAll(".block")];
    let shown = 0;
    all.forEach((block) => { block.hidden = !matches(block, text, state); if (!block.hidden) shown++; });
    const terms = [search.value.trim(), state].filter(Boolean).map((term) => `'${term}'`);
    empty.hidden = shown > 0 || all.length === 0;
    empty.textContent = `No block holds nodes matching ${terms.join(" and ")}.`;
    shownCount.textContent = terms.length ? `${shown} of ${all.length} blocks` : "";
  }

  search.addEventListener("input", filter);
  document.querySelectorAll(".state-filter button").forEach((button) => {
    button.addEventListener("click", () => {
      grid.dataset.filter = button.dataset.filter;
      document.querySelectorAll(".state-filter button").forEach((b) => b.setAttribute("aria-pressed", String(b === button)));
      filter();
    });
  });

  async function refresh() {
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      const blocks = fresh.getElementById("block-grid"), counts = fresh.querySelector(".counts");
      if (!blocks) { window.location.reload(); return; }  // the fleet shrank below the limit
      blocks.dataset.filter = grid.dataset.filter;
      grid.replaceWith(blocks); grid = blocks;
      if (counts) document.querySelector(".counts").replaceWith(counts);
      grid.dataset.refreshed = String(Date.now());
      filter();
    } catch (error) {
      console.warn(`blocks: ${error}`);
    }
  }
  setInterval(refresh, REFRESH_MS);
  filter();
})();

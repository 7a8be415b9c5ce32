// Times in UTC or the browser's zone: the nav's switch picks one, remembered per user in this
// browser (localStorage, keyed by the username). Tables: every <time datetime data-zoned> is
// rewritten in the zone and every [data-zone-label] names it. Charts (charts.js) shift their
// date axes' Unix ms with shift/parse below and redraw on "opsboard:zone": Plotly draws ms as
// UTC wall-clock time, so local time is drawn as ms shifted by the zone's offset then.
(function () {
  "use strict";
  const button = document.getElementById("zone-switch");
  const key = `opsboard.zone.${button ? button.dataset.user : ""}`;
  const localName = Intl.DateTimeFormat().resolvedOptions().timeZone || "browser zone";
  let zone = localStorage.getItem(key) === "local" ? "local" : "utc";

  const pad = (n, width = 2) => String(n).padStart(width, "0");

  const offsetMs = (ms) => (zone === "utc" ? 0 : -new Date(ms).getTimezoneOffset() * 60000);

  // Unix ms → the zone's wall-clock time as if it were UTC (what Plotly draws), and back.
  function shift(ms) { return ms + offsetMs(ms); }
  function unshift(wall) { const guess = wall - offsetMs(wall); return wall - offsetMs(guess); }

  // "YYYY-MM-DD HH:MM:SS.mmm" in the zone.
  function format(ms) {
    const d = new Date(shift(ms));
    return `${pad(d.getUTCFullYear(), 4)}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ` +
      `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}.${pad(d.getUTCMilliseconds(), 3)}`;
  }

  // Unix ms of a value drawn on a shifted date axis: a number, or the date string Plotly hands
  // back in its relayout events (the wall-clock time it shows).
  function parse(value) {
    if (typeof value === "number") return unshift(value);
    const m = /^(\d{4})-(\d{2})-(\d{2})(?:[ T](\d{2})(?::(\d{2})(?::(\d{2}(?:\.\d+)?))?)?)?/.exec(String(value));
    if (!m) return NaN;
    const [y, mo, d, h, mi] = m.slice(1, 6).map((v) => Number(v || 0));
    return unshift(Date.UTC(y, mo - 1, d, h, mi) + Number(m[6] || 0) * 1000);
  }

  function label() { return zone === "utc" ? "UTC" : `local time, ${localName}`; }

  function applyTables() {
    document.querySelectorAll("time[datetime][data-zoned]").forEach((el) => {
      const ms = Date.parse(el.getAttribute("datetime"));
      if (!Number.isNaN(ms)) el.textContent = format(ms).slice(0, 19);
    });
    document.querySelectorAll("[data-zone-label]").forEach((el) => { el.textContent = label(); });
    if (button) {
      button.textContent = zone === "utc" ? "times: UTC" : "times: local";
      button.title = zone === "utc" ? `show times in ${localName}` : "show times in UTC";
      button.dataset.zone = zone;
    }
  }

  if (button) {
    button.addEventListener("click", () => {
      zone = zone === "utc" ? "local" : "utc";
      localStorage.setItem(key, zone);
      applyTables();
      document.dispatchEvent(new CustomEvent("opsboard:zone", { detail: { zone } }));
    });
  }
  window.opsboardZone = { shift, format, parse, label, get zone() { return zone; } };
  applyTables();
})();

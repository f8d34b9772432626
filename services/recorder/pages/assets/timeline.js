// toolwire recorder: keeps a run's timeline current while the run progresses.
// The page follows the run's live event stream (Server-Sent Events; the
// browser reconnects by itself and resumes after the last event id) and, on
// each event, fetches the timeline fragment again from the server. Calls the
// reader opened stay open.
(() => {
  "use strict";
  const main = document.getElementById("run");
  if (!main) return;
  const run = main.dataset.run;

  // Materialize buttons (event delegation: they are replaced on refresh).
  const materialized = new Map();
  main.addEventListener("click", async (ev) => {
    const button = ev.target.closest("button[data-materialize]");
    if (!button) return;
    const out = button.closest(".call-body").querySelector(".materialized");
    try {
      const res = await fetch(button.dataset.materialize, { headers: { Accept: "application/json" } });
      const body = await res.json();
      out.textContent = JSON.stringify(body, null, 2);
    } catch (err) {
      out.textContent = "could not materialize: " + err;
    }
    out.hidden = false;
    materialized.set(out.dataset.for, out.textContent);
  });

  if (main.dataset.live !== "true") return;

  let timer = 0, busy = false, again = false;
  const refresh = async () => {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const open = new Set([...main.querySelectorAll("details[open]")].map((d) => d.dataset.key));
      // A note being written in an approval form survives the refresh.
      const notes = new Map([...main.querySelectorAll("form[data-decide]")].map((f) => [f.dataset.decide, f.elements.note.value]));
      const res = await fetch("/runs/" + encodeURIComponent(run) + "/timeline", { headers: { Accept: "text/html" } });
      if (res.ok) {
        main.innerHTML = await res.text();
        for (const d of main.querySelectorAll("details[data-key]")) {
          if (open.has(d.dataset.key)) d.open = true;
        }
        for (const f of main.querySelectorAll("form[data-decide]")) {
          if (notes.get(f.dataset.decide)) f.elements.note.value = notes.get(f.dataset.decide);
        }
        for (const [key, text] of materialized) {
          const out = main.querySelector('.materialized[data-for="' + key + '"]');
          if (out) { out.textContent = text; out.hidden = false; }
        }
        main.dataset.refreshes = String(Number(main.dataset.refreshes || 0) + 1);
      }
    } finally {
      busy = false;
      if (again) { again = false; schedule(); }
    }
  };
  const schedule = () => { clearTimeout(timer); timer = setTimeout(refresh, 80); };
  const setLive = (text, on) => {
    const el = document.getElementById("live");
    if (!el) return;
    el.textContent = text;
    el.classList.toggle("off", !on);
  };

  const url = new URL(main.dataset.stream, location.href);
  url.searchParams.set("after", main.dataset.after || "0");
  const stream = new EventSource(url);
  stream.onmessage = () => { setLive("live", true); schedule(); };
  stream.addEventListener("end", () => { stream.close(); schedule(); setLive("ended", false); });
  stream.onerror = () => { if (stream.readyState !== EventSource.CLOSED) setLive("reconnecting…", false); };
})();

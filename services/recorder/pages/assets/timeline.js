// toolwire recorder: keeps a run's timeline current while the run progresses.
// The page follows the run's live event stream (Server-Sent Events; the
// browser reconnects by itself and resumes after the last event id) and, on
// each event, fetches the timeline fragment again from the server. Calls the
// reader opened stay open.
//
// A run whose agent streams also sends the model's answer as it grows
// ("delta" messages, pkg/events/delta.go): each model call shows a
// "thinking" line (its text so far, the tools it starts to call, a mark for
// each attempt discarded) until its turn event comes, which replaces it.
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
        for (const n of thinking.keys()) renderThinking(n);
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

  // The thinking lines: per model call (iteration) still streaming, its
  // text so far, the names of the tools it calls, its attempts discarded.
  // They are drawn with textContent only: a model's text is never markup.
  const thinking = new Map();
  const renderThinking = (n) => {
    const t = thinking.get(n);
    let li = main.querySelector('li[data-thinking="' + n + '"]');
    if (!t) { if (li) li.remove(); return; }
    const list = main.querySelector("#timeline");
    if (!list) return;
    if (!li) {
      li = document.createElement("li");
      li.className = "iteration thinking";
      li.dataset.thinking = String(n);
      const head = document.createElement("div");
      head.className = "iteration-head";
      const h2 = document.createElement("h2");
      h2.textContent = "Iteration " + n;
      const badge = document.createElement("span");
      badge.className = "badge running";
      badge.textContent = "thinking…";
      const marks = document.createElement("span");
      marks.className = "discards";
      head.append(h2, badge, marks);
      const body = document.createElement("div");
      body.className = "turn";
      const text = document.createElement("p");
      text.className = "turn-text thinking-text";
      const tools = document.createElement("p");
      tools.className = "thinking-tools muted";
      body.append(text, tools);
      li.append(head, body);
      list.querySelector(".iteration.empty")?.remove();
      list.append(li);
    }
    li.querySelector(".thinking-text").textContent = t.text;
    const names = t.tools.filter(Boolean);
    li.querySelector(".thinking-tools").textContent = names.length ? "calling " + names.join(", ") : "";
    const marks = li.querySelector(".discards");
    marks.replaceChildren(...t.discarded.map((a) => {
      const b = document.createElement("span");
      b.className = "badge warn discarded";
      b.textContent = "attempt " + a + " discarded, retrying";
      return b;
    }));
  };
  const onDelta = (d) => {
    const n = d.iteration;
    const t = thinking.get(n) || { text: "", tools: [], discarded: [] };
    thinking.set(n, t);
    if (d.discarded) {
      // What the attempt streamed is void; the call starts over.
      t.text = "";
      t.tools = [];
      t.discarded.push(d.attempt);
    } else if (d.tool_call) {
      if (d.tool_call.name) t.tools[d.tool_call.index] = d.tool_call.name;
    } else if (d.text) {
      t.text += d.text;
    }
    renderThinking(n);
  };
  // A turn (or the run's end, which carries the last) ends the thinking of
  // its model call and of those before: the timeline shows the turn.
  const onEvent = (data) => {
    let e;
    try { e = JSON.parse(data); } catch { return; }
    const type = e.type || "";
    let upTo = 0;
    if (type === "dev.toolwire.run.turn.completed.v1") upTo = e.data?.iteration || 0;
    else if (/^dev\.toolwire\.run\.(completed|failed|cancelled)\./.test(type)) upTo = Infinity;
    for (const n of [...thinking.keys()]) {
      if (n <= upTo) { thinking.delete(n); renderThinking(n); }
    }
  };

  const url = new URL(main.dataset.stream, location.href);
  url.searchParams.set("after", main.dataset.after || "0");
  const stream = new EventSource(url);
  // Open: the stream follows the run (its deltas too) from now on.
  stream.onopen = () => { main.dataset.connected = "true"; setLive("live", true); };
  stream.onmessage = (m) => { setLive("live", true); onEvent(m.data); schedule(); };
  stream.addEventListener("delta", (m) => {
    setLive("live", true);
    try { onDelta(JSON.parse(m.data)); } catch { /* not a delta: ignored */ }
  });
  stream.addEventListener("end", () => { stream.close(); schedule(); setLive("ended", false); });
  stream.onerror = () => { if (stream.readyState !== EventSource.CLOSED) setLive("reconnecting…", false); };
})();

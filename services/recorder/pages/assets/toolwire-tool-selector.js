// <toolwire-tool-selector>: the tool selector and pin configurator of the
// recorder's tools page, as a standard web component for a host's own page
// (a workflow editor). One ES module, no dependencies:
//
//   <script type="module" src="https://recorder.example/assets/toolwire-tool-selector.js"></script>
//   <toolwire-tool-selector api="https://recorder.example" token="..."></toolwire-tool-selector>
//
// It reads GET /v1/tools with the host's bearer token (the recorder must list
// the host's origin in TOOLWIRE_RECORDER_CORS_ORIGINS), shows the tools
// grouped by kind with each one's key status, and emits a
// "toolwire-selection" event (bubbling, composed) whenever the choice
// changes: detail = {enabled_tools: ["name@version", ...], pinned_handles:
// [{name, selector: {tool, strategy, call_id?}, on_missing}, ...]}, the
// fields of an agent's configuration in a RunRequest.

const KINDS = [
  ["builtin", "Built-in"], ["http", "HTTP"], ["mcp", "MCP"], ["sandbox", "Sandbox"], ["worker", "Worker queue"],
];

const STYLE = `
:host { display: block; font: 14px/1.4 system-ui, sans-serif; color: #1b2330; }
fieldset { border: 1px solid #dfe3ea; border-radius: 8px; margin: 0 0 .6rem; padding: .4rem .8rem; }
legend { font-weight: 600; padding: 0 .3rem; }
label.tool { display: flex; gap: .5rem; align-items: center; padding: .15rem 0; }
.ref { font-family: ui-monospace, monospace; }
.badge { font-size: .75rem; border-radius: 4px; padding: 0 .35rem; background: #eef1f6; }
.badge.missing { background: #fbeae8; color: #7d2218; }
.badge.ready { background: #e6f4ea; color: #1e6b34; }
.summary { display: flex; gap: .8rem; align-items: center; margin: .4rem 0; }
.pin { border: 0; background: none; cursor: pointer; font-size: 1rem; }
.pin[aria-pressed="true"] { filter: none; } .pin[aria-pressed="false"] { filter: grayscale(1); opacity: .5; }
.pin-editor { display: flex; gap: .5rem; flex-wrap: wrap; margin: .2rem 0 .4rem 1.6rem; }
.error { color: #7d2218; }
`;

class ToolSelector extends HTMLElement {
  static observedAttributes = ["api", "token", "org", "workspace"];

  constructor() {
    super();
    this.attachShadow({ mode: "open" });
    this.tools = [];
    this.selected = new Set();
    this.pins = new Map(); // ref -> {name, strategy, call_id, on_missing}
  }

  connectedCallback() { this.reload(); }

  attributeChangedCallback() { if (this.isConnected) this.reload(); }

  /** reload loads the catalog once for every change made in one task (an
   * upgrade sets each attribute, then connects). */
  reload() {
    if (this.reloading) return;
    this.reloading = true;
    queueMicrotask(() => { this.reloading = false; this.load(); });
  }

  /** The current choice, as the event carries it. */
  get selection() {
    const enabled = [...this.selected].sort();
    const pinned = [];
    for (const ref of enabled) {
      const p = this.pins.get(ref);
      if (!p) continue;
      const selector = { tool: ref.split("@")[0], strategy: p.strategy };
      if (p.strategy === "by_call_id") selector.call_id = p.call_id;
      pinned.push({ name: p.name, selector, on_missing: p.on_missing });
    }
    return { enabled_tools: enabled, pinned_handles: pinned };
  }

  async load() {
    const api = (this.getAttribute("api") || "").replace(/\/$/, "");
    const q = new URLSearchParams();
    if (this.getAttribute("org")) q.set("org_id", this.getAttribute("org"));
    if (this.getAttribute("workspace")) q.set("workspace_id", this.getAttribute("workspace"));
    const headers = {};
    if (this.getAttribute("token")) headers.Authorization = "Bearer " + this.getAttribute("token");
    try {
      const res = await fetch(`${api}/v1/tools?${q}`, { headers, credentials: "omit" });
      const body = await res.json();
      if (!res.ok) throw new Error(body?.error?.message || `HTTP ${res.status}`);
      this.tools = body.tools;
      this.render();
    } catch (e) {
      this.renderError(e);
    }
  }

  renderError(e) {
    this.shadowRoot.replaceChildren(style(), el("p", { class: "error", role: "alert" }, `The tools cannot be read: ${e.message}`));
  }

  render() {
    const root = [style()];
    const summary = el("div", { class: "summary" },
      el("span", { class: "count" }, `${this.selected.size} selected`),
      button("Clear all", { class: "clear" }, () => { this.selected.clear(); this.pins.clear(); this.changed(); }));
    root.push(summary);
    for (const [kind, label] of KINDS) {
      const tools = this.tools.filter((t) => t.kind === kind);
      if (!tools.length) continue;
      const fs = el("fieldset", { "data-kind": kind }, el("legend", {}, `${label} (${tools.length})`));
      for (const t of tools) fs.append(...this.row(t));
      root.push(fs);
    }
    this.shadowRoot.replaceChildren(...root);
  }

  row(t) {
    const on = this.selected.has(t.ref);
    const box = el("input", { type: "checkbox", value: t.ref });
    box.checked = on;
    box.addEventListener("change", () => {
      if (box.checked) this.selected.add(t.ref); else { this.selected.delete(t.ref); this.pins.delete(t.ref); }
      this.changed();
    });
    const auth = t.auth.status === "missing" ? "Missing API Key" : t.auth.status === "ready" ? "Ready" : t.auth.status === "none" ? "No key needed" : "Key status unknown";
    const pinned = this.pins.has(t.ref);
    const pin = button("📌", { class: "pin", "aria-pressed": String(pinned), "aria-label": `pin an output of ${t.ref}`, title: "pin an output" }, () => {
      if (pinned) this.pins.delete(t.ref);
      else {
        this.selected.add(t.ref);
        this.pins.set(t.ref, { name: t.name, strategy: "latest", call_id: "", on_missing: "null" });
      }
      this.changed();
    });
    const label = el("label", { class: "tool", "data-ref": t.ref }, box, el("span", { class: "ref" }, t.ref),
      el("span", { class: `badge ${t.auth.status}` }, auth), t.deprecated ? el("span", { class: "badge" }, "deprecated") : "");
    const out = [el("div", { class: "tool-row" }, label, pin)];
    if (pinned) out.push(this.pinEditor(t.ref));
    return out;
  }

  pinEditor(ref) {
    const p = this.pins.get(ref);
    const name = el("input", { name: "handle", value: p.name, "aria-label": `handle name of ${ref}` });
    name.addEventListener("change", () => { p.name = name.value; this.changed(false); });
    const strategy = select(["latest", "first_success", "by_call_id"], p.strategy, `strategy of ${ref}`);
    strategy.name = "strategy";
    strategy.addEventListener("change", () => { p.strategy = strategy.value; this.changed(); });
    const onMissing = select(["null", "error", "stale_last_success"], p.on_missing, `on missing of ${ref}`);
    onMissing.name = "on_missing";
    onMissing.addEventListener("change", () => { p.on_missing = onMissing.value; this.changed(false); });
    const editor = el("div", { class: "pin-editor", "data-ref": ref }, name, strategy, onMissing);
    if (p.strategy === "by_call_id") {
      const call = el("input", { name: "call_id", value: p.call_id, placeholder: "call id (64 hex digits)", "aria-label": `call id of ${ref}` });
      call.addEventListener("change", () => { p.call_id = call.value.trim(); this.changed(false); });
      editor.append(call);
    }
    return editor;
  }

  /** changed re-renders (unless only a field's text changed) and emits the choice. */
  changed(rerender = true) {
    if (rerender) this.render();
    this.dispatchEvent(new CustomEvent("toolwire-selection", { detail: this.selection, bubbles: true, composed: true }));
  }
}

function style() { return el("style", {}, STYLE); }

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const c of children) if (c !== "") e.append(c);
  return e;
}

function button(text, attrs, onClick) {
  const b = el("button", { type: "button", ...attrs }, text);
  b.addEventListener("click", onClick);
  return b;
}

function select(options, value, label) {
  const s = el("select", { "aria-label": label }, ...options.map((o) => el("option", { value: o }, o)));
  s.value = value;
  return s;
}

if (!customElements.get("toolwire-tool-selector")) customElements.define("toolwire-tool-selector", ToolSelector);

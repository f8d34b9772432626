// The agent builder's page (templates/builder.html): the selected tools'
// summary follows the checkboxes, and the Copy buttons copy the JSON. The
// page works without it: every button submits the form.
(function () {
  "use strict";
  const form = document.getElementById("builder");
  if (!form) return;
  const count = document.getElementById("selected-count");
  const list = document.getElementById("selected-list");
  const summarize = () => {
    const refs = Array.from(form.querySelectorAll('input[name="tool"]:checked')).map((i) => i.value);
    count.textContent = String(refs.length);
    list.textContent = refs.length ? ": " + refs.join(", ") : "";
  };
  form.addEventListener("change", (e) => {
    if (e.target instanceof HTMLInputElement && e.target.name === "tool") summarize();
  });
  for (const b of form.querySelectorAll("button.copy")) {
    b.addEventListener("click", async () => {
      const pre = document.getElementById(b.dataset.copy);
      if (!pre) return;
      const text = pre.textContent;
      try {
        await navigator.clipboard.writeText(text);
      } catch {
        // No clipboard API (a page over plain HTTP beyond loopback):
        // select the text for the visitor to copy.
        const range = document.createRange();
        range.selectNodeContents(pre);
        const sel = window.getSelection();
        sel.removeAllRanges();
        sel.addRange(range);
        b.textContent = "Selected: press Ctrl+C";
        return;
      }
      b.textContent = "Copied";
      setTimeout(() => { b.textContent = "Copy"; }, 1500);
    });
  }
})();

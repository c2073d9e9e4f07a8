// The approvals page: keep the pending list current from the server's event stream (new held
// calls appear, decided or expired ones leave; an item being edited is never re-rendered) and
// count down each one's time left. No framework, no build step.
"use strict";
(function () {
  const list = document.getElementById("pending");

  function tick() {
    const now = Date.now() / 1000;
    for (const el of document.querySelectorAll(".left[data-expires]")) {
      const left = Math.max(0, Math.floor(Number(el.dataset.expires) - now));
      el.textContent = left > 0 ? left + " s" : "expired";
    }
  }

  function fragment(html) {
    const t = document.createElement("template");
    t.innerHTML = html.trim();
    return t.content.firstElementChild;
  }

  function reconcile(items) {
    const wanted = new Set(items.map((i) => i.id));
    for (const el of Array.from(list.children)) {
      if (!wanted.has(el.dataset.id)) el.remove();
    }
    let before = list.firstElementChild;
    for (const item of items) {
      let el = document.getElementById(item.id);
      if (!el) el = fragment(item.html);
      if (el !== before) list.insertBefore(el, before);
      before = el.nextElementSibling;
    }
    const empty = document.getElementById("pending-empty");
    if (empty) empty.hidden = items.length > 0;
    const count = document.getElementById("pending-count");
    if (count) count.textContent = items.length + " pending";
    tick();
  }

  if (list && window.EventSource) {
    const source = new EventSource(list.dataset.events);
    source.addEventListener("pending", (ev) => reconcile(JSON.parse(ev.data).items));
    source.addEventListener("logout", () => { source.close(); window.location.reload(); });
  }
  if (document.querySelector(".left[data-expires]") || list) {
    tick();
    window.setInterval(tick, 1000);
  }
})();

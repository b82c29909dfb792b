// irkit viz — single-file viewer. Data: <script id="irkit-data" type="application/json">.
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("irkit-data").textContent);
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  let trail = [];   // [[graphKey, label], ...] from the main graph to the shown body
  let zoom = 1;

  function show(newTrail, focusId) {
    trail = newTrail;
    const key = trail[trail.length - 1][0];
    const g = DATA.graphs[key];
    const canvas = $("canvas");
    canvas.innerHTML = g.svg;   // bodies are laid out already; inserted only when opened
    const svg = canvas.querySelector("svg");
    if (svg) {
      svg.dataset.w = svg.getAttribute("width");
      svg.dataset.h = svg.getAttribute("height");
      applyZoom();
      svg.querySelectorAll("g.node").forEach((n) => wire(n, key));
    }
    renderCrumbs();
    document.title = DATA.title + " — " + trail.map((t) => t[1]).join(" › ");
    if (focusId) focus(focusId, key); else card(null, key);
  }

  function applyZoom() {
    const svg = $("canvas").querySelector("svg");
    if (!svg) return;
    svg.setAttribute("width", parseFloat(svg.dataset.w) * zoom + "pt");
    svg.setAttribute("height", parseFloat(svg.dataset.h) * zoom + "pt");
  }

  function wire(gnode, key) {
    const info = DATA.graphs[key].nodes[gnode.id];
    if (!info) return;
    gnode.querySelectorAll("title").forEach((t) => t.remove());
    gnode.addEventListener("mouseenter", () => card(info, key));
    gnode.addEventListener("click", (ev) => {
      ev.stopPropagation();
      if (info.callee && !ev.shiftKey) {
        openCall(info);
      } else {
        mark(gnode);
        card(info, key, true);
      }
    });
  }

  // A call's instance path: its name relative to the module path of the body it is called from.
  function instanceLabel(info) {
    const here = trail[trail.length - 1];
    return trail.length > 1 ? here[1] + "." + info.label : info.label;
  }
  function openCall(info) {
    show(trail.concat([[info.callee, instanceLabel(info)]]));
  }

  let pinned = false;
  function mark(gnode) {
    document.querySelectorAll("#canvas g.node.hl").forEach((n) => n.classList.remove("hl"));
    if (gnode) gnode.classList.add("hl");
  }

  function focus(id, key) {
    const gnode = document.getElementById(id);
    mark(gnode);
    if (gnode) gnode.scrollIntoView({ block: gnode.classList.contains("cluster") ? "start" : "center", inline: "center" });
    card(DATA.graphs[key].nodes[id] || null, key, true);
  }

  function renderCrumbs() {
    const c = $("crumbs-path");
    c.innerHTML = "";
    trail.forEach((t, i) => {
      if (i) c.appendChild(el("span", "sep", "›"));
      const a = el("a", null, t[1]);
      a.addEventListener("click", () => show(trail.slice(0, i + 1)));
      c.appendChild(a);
    });
  }

  function row(table, k, v) {
    const tr = el("tr");
    tr.appendChild(el("td", null, k));
    const td = el("td", "mono", v);
    tr.appendChild(td);
    table.appendChild(tr);
  }

  function card(info, key, pin) {
    if (pinned && !pin && info) return;   // a clicked card stays until the next click
    pinned = !!pin;
    const side = $("side");
    side.innerHTML = "";
    const g = DATA.graphs[key];
    if (!info) {
      side.appendChild(el("h2", null, g.title));
      const t = el("table");
      if (trail.length > 1) row(t, "module", trail[trail.length - 1][1]);
      g.about.forEach((kv) => row(t, kv[0], kv[1]));
      side.appendChild(t);
      side.appendChild(el("p", "hint", "Click a function box to open its body (shift-click: details). Hover or click a node for its card."));
      return;
    }
    const module = info.callee ? instanceLabel(info) : null;
    side.appendChild(el("h2", null, module ? info.op + "  " + module : info.title));
    const t = el("table");
    if (module) row(t, "module", module);
    info.fields.forEach((kv) => {
      // A shared body was built from one instance: name the module of the opened instance.
      if ((kv[0] === "module" || kv[0] === "in module") && info.module_rel !== null && info.module_rel !== undefined && trail.length > 1) {
        const here = trail[trail.length - 1][1];
        row(t, kv[0], info.module_rel ? here + "." + info.module_rel : here);
      } else {
        row(t, kv[0], kv[1]);
      }
    });
    side.appendChild(t);
    const sections = [["inputs", info.inputs], ["outputs", info.outputs], ["attributes", info.attrs], ["metadata", info.meta]];
    sections.forEach(([name, items]) => {
      if (!items || !items.length) return;
      side.appendChild(el("div", "section", name));
      const tt = el("table");
      items.forEach((kv) => row(tt, kv[0], kv[1]));
      side.appendChild(tt);
    });
    if (info.callee) {
      const b = el("button", null, "open body ›");
      b.addEventListener("click", () => openCall(info));
      side.appendChild(b);
    }
  }

  // Search over every graph's nodes: name, op, module path, class, FX node, source.
  const INDEX = [];
  Object.keys(DATA.graphs).forEach((key) => {
    const nodes = DATA.graphs[key].nodes;
    Object.keys(nodes).forEach((id) => INDEX.push([nodes[id].search, key, id, nodes[id]]));
  });
  function search(q) {
    const box = $("results");
    box.innerHTML = "";
    q = q.trim().toLowerCase();
    if (!q) { box.style.display = "none"; return; }
    let n = 0;
    for (const [text, key, id, info] of INDEX) {
      if (text.indexOf(q) < 0) continue;
      if (++n > 200) break;
      const d = el("div");
      d.appendChild(el("span", "where", DATA.graphs[key].short));
      d.appendChild(el("span", "op", info.op + " "));
      d.appendChild(document.createTextNode(info.name));
      d.addEventListener("click", () => { box.style.display = "none"; show(DATA.trails[key], id); });
      box.appendChild(d);
    }
    if (!n) box.appendChild(el("div", "hint", "no match"));
    box.style.display = "block";
  }

  function buildTree(node, parent) {
    const label = () => {
      const s = el("span");
      s.appendChild(document.createTextNode(node.label + " "));
      s.appendChild(el("span", "cls", node.cls));
      if (node.count > 1) s.appendChild(el("span", "mult", " ×" + node.count));
      return s;
    };
    const open = () => show(node.trail, node.focus);
    if (node.children && node.children.length) {
      const d = el("details");
      if (node.open) d.open = true;
      const s = el("summary");
      s.appendChild(label());
      s.addEventListener("dblclick", open);
      s.addEventListener("click", (ev) => { if (ev.detail === 1 && ev.offsetX > 14) { ev.preventDefault(); open(); } });
      d.appendChild(s);
      node.children.forEach((c) => buildTree(c, d));
      parent.appendChild(d);
    } else {
      const s = el("div", "leaf");
      s.appendChild(label());
      s.addEventListener("click", open);
      parent.appendChild(s);
    }
  }

  $("search").addEventListener("input", (ev) => search(ev.target.value));
  $("search").addEventListener("keydown", (ev) => { if (ev.key === "Escape") { ev.target.value = ""; search(""); } });
  $("zoom-in").addEventListener("click", () => { zoom *= 1.25; applyZoom(); });
  $("zoom-out").addEventListener("click", () => { zoom /= 1.25; applyZoom(); });
  $("zoom-fit").addEventListener("click", () => {
    const svg = $("canvas").querySelector("svg");
    if (!svg) return;
    const c = $("canvas");
    const w = parseFloat(svg.dataset.w) * 4 / 3, h = parseFloat(svg.dataset.h) * 4 / 3;
    zoom = Math.min(c.clientWidth / w, c.clientHeight / h, 1.5);
    applyZoom();
  });
  document.addEventListener("click", (ev) => { if (!$("results").contains(ev.target)) $("results").style.display = "none"; });
  buildTree(DATA.tree, $("tree"));
  show(DATA.start || [[DATA.root, DATA.graphs[DATA.root].short]]);
  window.irkitViz = { show: show, search: search, data: DATA, trail: () => trail };
})();

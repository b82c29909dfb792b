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

  // ---- drawing: the bundled dagre lays a body out when it is first opened -------------------
  const SVGNS = "http://www.w3.org/2000/svg";
  const measure = document.createElement("canvas").getContext("2d");
  const FONT = '"DejaVu Sans", Verdana, Arial, sans-serif';
  function textWidth(text, size) {
    measure.font = size + "px " + FONT;
    return measure.measureText(text).width;
  }
  const esc = (t) => String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  const LINE = 13, PADX = 10, PADY = 5, TITLE = 26;
  const LARGE = 300;   // more nodes: edge shapes become tooltips instead of labels
  const drawn = {};    // graph key -> {svg, ms}: each body is laid out once per page
  function boxSize(n) {
    const size = n[2] === "const" ? 9 : 10;
    let w = 20;
    n[1].forEach((line, i) => { w = Math.max(w, textWidth(line, size) * (i === 0 && (n[2] === "call" || n[2] === "region") ? 1.08 : 1)); });
    w += 2 * PADX + (n[2] === "input" || n[2] === "output" ? 14 : 0);
    return [Math.max(w, 40), LINE * n[1].length + 2 * PADY];
  }
  // dagre's bend points joined by quadratic curves through the segments' midpoints (drawing only).
  function smoothPath(pts) {
    const f = (p) => p.x.toFixed(1) + "," + p.y.toFixed(1);
    if (pts.length < 3) return "M" + pts.map(f).join("L");
    let d = "M" + f(pts[0]);
    for (let i = 1; i < pts.length - 1; i++) {
      const mid = { x: (pts[i].x + pts[i + 1].x) / 2, y: (pts[i].y + pts[i + 1].y) / 2 };
      d += "Q" + f(pts[i]) + " " + (i === pts.length - 2 ? f(pts[i + 1]) : f(mid));
    }
    return d;
  }

  function layoutSvg(key) {
    if (drawn[key]) return drawn[key];
    const t0 = performance.now();
    const G = DATA.graphs[key].graph;
    const large = G.nodes.length > LARGE;
    const g = new dagre.graphlib.Graph({ multigraph: true });
    g.setGraph({ rankdir: "TB", nodesep: 18, ranksep: large ? 22 : 30, edgesep: 8, marginx: 12, marginy: 12 });
    g.setDefaultEdgeLabel(() => ({}));
    G.nodes.forEach((n) => { const [w, h] = boxSize(n); g.setNode(n[0], { width: w, height: h }); });
    G.edges.forEach((e, i) => {
      const lab = !large && e[2] ? { width: textWidth(e[2], 8) + 4, height: 10, labelpos: "r", labeloffset: 4 } : {};
      g.setEdge(e[0], e[1], lab, "e" + i);
    });
    try {
      dagre.layout(g);
    } catch (err) {   // dagre recurses: a body of a few thousand nodes in one chain overflows
      drawn[key] = { svg: '<p class="hint" style="margin:12px">' + esc(G.title) + ": " + G.nodes.length +
        " nodes are too many to lay out in the page (" + esc(String(err)) + "). Write this body as a picture with " +
        "<code>--format svg --function …</code> or the page with <code>--layout dot</code>.</p>", ms: performance.now() - t0 };
      return drawn[key];
    }
    const gg = g.graph();
    const titleW = textWidth(G.title, 12) + 24;
    const W = Math.max(gg.width || 0, titleW), H = (gg.height || 0) + TITLE;
    const dx = (W - (gg.width || 0)) / 2;
    const out = [];
    out.push('<svg xmlns="' + SVGNS + '" width="' + W.toFixed(0) + '" height="' + H.toFixed(0) + '" viewBox="0 0 ' + W.toFixed(1) + " " + H.toFixed(1) + '" font-family=\'' + FONT + '\'>');
    out.push('<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="#8a8a8a"/></marker></defs>');
    out.push('<g class="graph"><text x="' + (W / 2).toFixed(1) + '" y="17" text-anchor="middle" font-size="12">' + esc(G.title) + "</text>");
    out.push('<g transform="translate(' + dx.toFixed(1) + "," + TITLE + ')">');
    G.edges.forEach((e, i) => {
      const ed = g.edge(e[0], e[1], "e" + i);
      if (!ed || !ed.points) return;
      const d = smoothPath(ed.points);
      out.push('<g class="edge"><title>' + esc(e[2]) + '</title><path d="' + d + '" fill="none" stroke="#8a8a8a" marker-end="url(#arrow)"/>');
      if (!large && e[2] && ed.x !== undefined) out.push('<text x="' + (ed.x - ed.width / 2 + 2).toFixed(1) + '" y="' + (ed.y + 3).toFixed(1) + '" font-size="8" fill="#555">' + esc(e[2]) + "</text>");
      out.push("</g>");
    });
    const FILL = { op: ["#eef3fb", "#5b7db1"], call: ["#fff4d6", "#b07d00"], region: ["#f4f0fb", "#7a5bb1"], input: ["#e6f4ea", "#4c9a5f"], output: ["#fdecea", "#c0504d"], const: ["#f2f2f2", "#aaaaaa"], flow: ["#e8f6f8", "#16808f"] };
    const MARKS = { added: "#d4f7d4", removed: "#ffd6d6", changed: "#fff0b3" };
    G.nodes.forEach((n) => {
      const nd = g.node(n[0]);
      const [fill0, stroke] = FILL[n[2]] || FILL.op;
      const fill = n[3] ? MARKS[n[3]] || fill0 : fill0;
      const cls = "node " + n[2] + (n[3] ? " " + n[3] : "");
      out.push('<g id="' + esc(n[0]) + '" class="' + cls + '"><title>' + esc(n[4]) + "</title>");
      if (n[2] === "input" || n[2] === "output") {
        out.push('<ellipse cx="' + nd.x.toFixed(1) + '" cy="' + nd.y.toFixed(1) + '" rx="' + (nd.width / 2).toFixed(1) + '" ry="' + (nd.height / 2).toFixed(1) + '" fill="' + fill + '" stroke="' + stroke + '"/>');
      } else {
        const bold = n[2] === "call" || n[2] === "region" || n[2] === "flow";
        out.push('<rect x="' + (nd.x - nd.width / 2).toFixed(1) + '" y="' + (nd.y - nd.height / 2).toFixed(1) + '" width="' + nd.width.toFixed(1) + '" height="' + nd.height.toFixed(1) + '" rx="4" fill="' + fill + '" stroke="' + stroke + '"' + (bold ? ' stroke-width="2"' : "") + "/>");
      }
      const size = n[2] === "const" ? 9 : 10;
      const top = nd.y - (LINE * n[1].length) / 2 + LINE * 0.75;
      n[1].forEach((line, k) => {
        const weight = k === 0 && (n[2] === "call" || n[2] === "region" || n[2] === "flow") ? ' font-weight="bold"' : "";
        out.push('<text x="' + nd.x.toFixed(1) + '" y="' + (top + k * LINE).toFixed(1) + '" text-anchor="middle" font-size="' + size + '"' + weight + ">" + esc(line) + "</text>");
      });
      out.push("</g>");
    });
    out.push("</g></g></svg>");
    drawn[key] = { svg: out.join(""), ms: performance.now() - t0 };
    return drawn[key];
  }

  function show(newTrail, focusId) {
    const sameBody = trail.length && trail[trail.length - 1][0] === newTrail[newTrail.length - 1][0];
    if (!sameBody) zoom = 1;   // another body opens at its natural size
    trail = newTrail;
    const key = trail[trail.length - 1][0];
    const g = DATA.graphs[key];
    const canvas = $("canvas");
    // Graphviz pictures (--layout dot) come laid out; the others are laid out now, once.
    canvas.innerHTML = g.svg !== undefined ? g.svg : layoutSvg(key).svg;
    const svg = canvas.querySelector("svg");
    if (svg) {
      const unit = g.svg !== undefined ? 4 / 3 : 1;   // Graphviz sizes are in pt
      svg.dataset.w = parseFloat(svg.getAttribute("width")) * unit;
      svg.dataset.h = parseFloat(svg.getAttribute("height")) * unit;
      applyZoom();
      canvas.scrollTop = 0;
      canvas.scrollLeft = Math.max(0, (canvas.scrollWidth - canvas.clientWidth) / 2);  // wide bodies: start centred
      svg.querySelectorAll("g.node").forEach((n) => wire(n, key));
    }
    renderCrumbs();
    document.title = DATA.title + " — " + trail.map((t) => t[1]).join(" › ");
    if (focusId) focus(focusId, key); else card(null, key);
  }

  function applyZoom() {
    const svg = $("canvas").querySelector("svg");
    if (!svg) return;
    svg.setAttribute("width", parseFloat(svg.dataset.w) * zoom + "px");
    svg.setAttribute("height", parseFloat(svg.dataset.h) * zoom + "px");
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
      } else if (info.branches && info.branches.length === 1 && !ev.shiftKey) {
        openBranch(info, info.branches[0]);
      } else {
        mark(gnode);
        card(info, key, true);
      }
    });
  }

  // A call's instance path: its name relative to the module path of the body it is called from.
  function instanceLabel(info) {
    if (info.path !== undefined) return info.path;   // a region of a flat graph: its full path
    const here = trail[trail.length - 1];
    return trail.length > 1 ? here[1] + "." + info.label : info.label;
  }
  function openCall(info) {
    show(trail.concat([[info.callee, instanceLabel(info)]]));
  }
  // A subgraph of an If/Loop/Scan node opens like a call: [graph key, attribute name].
  function openBranch(info, branch) {
    const here = trail[trail.length - 1][1];
    const name = (info.name || info.op) + "." + branch[1];
    show(trail.concat([[branch[0], trail.length > 1 ? here + "/" + name : name]]));
  }
  // The path of what a card shows: a module's path, or a node's module path and name.
  function pathOf(info) {
    if (info.callee) return instanceLabel(info);
    const key = trail[trail.length - 1][0];
    const here = trail.length > 1 ? trail[trail.length - 1][1] : "";
    let module = "";
    info.fields.forEach((kv) => { if (kv[0] === "module") module = kv[1]; });
    // In a function body the node belongs to the opened instance (its sub-module, if inlined).
    const inFunction = trail.length > 1 && !/^(scope|chunk):/.test(key) && key.indexOf("/") < 0;
    if (inFunction) module = info.module_rel ? here + "." + info.module_rel : here;
    return (module ? module + "/" : "") + info.name;
  }
  let copied = null;
  function copy(text) {
    copied = text;
    const done = () => { const h = $("copied"); if (h) h.textContent = "copied: " + text; };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, () => { fallbackCopy(text); done(); });
    } else { fallbackCopy(text); done(); }
  }
  function fallbackCopy(text) {
    const ta = el("textarea");
    ta.value = text;
    document.body.appendChild(ta);
    ta.select();
    try { document.execCommand("copy"); } catch (e) { /* the path stays shown in the card */ }
    ta.remove();
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
    const tools = el("div", "tools");
    const cp = el("button", "copy-path", "copy path");
    const path = pathOf(info);
    cp.title = path;
    cp.addEventListener("click", () => copy(path));
    tools.appendChild(cp);
    if (info.callee) {
      const b = el("button", "open", "open body ›");
      b.addEventListener("click", () => openCall(info));
      tools.appendChild(b);
    }
    (info.branches || []).forEach((br) => {
      const b = el("button", "open-branch", "open " + br[1] + " ›");
      b.addEventListener("click", () => openBranch(info, br));
      tools.appendChild(b);
    });
    side.appendChild(tools);
    side.appendChild(el("div", "hint", "")).id = "copied";
    const sections = [["inputs", info.inputs], ["outputs", info.outputs], ["attributes", info.attrs], ["metadata", info.meta]];
    sections.forEach(([name, items]) => {
      if (!items || !items.length) return;
      side.appendChild(el("div", "section", name));
      const tt = el("table");
      items.forEach((kv) => row(tt, kv[0], kv[1]));
      side.appendChild(tt);
    });
    if (info.params && info.params.length) {
      side.appendChild(el("div", "section", "parameters"));
      const tt = el("table", "params");
      info.params.forEach((p) => {
        row(tt, p[0], p[1]);
        if (p[2]) row(tt, "", p[2]);
      });
      side.appendChild(tt);
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
    const w = parseFloat(svg.dataset.w), h = parseFloat(svg.dataset.h);
    zoom = Math.min(c.clientWidth / w, c.clientHeight / h, 1.5);
    applyZoom();
  });
  document.addEventListener("click", (ev) => { if (!$("results").contains(ev.target)) $("results").style.display = "none"; });
  buildTree(DATA.tree, $("tree"));
  show(DATA.start || [[DATA.root, DATA.graphs[DATA.root].short]]);
  const firstPaint = performance.now();
  window.irkitViz = {
    show: show, search: search, data: DATA, trail: () => trail,
    copied: () => copied, layoutMs: (key) => (drawn[key] ? drawn[key].ms : null),
    firstPaintMs: firstPaint,
  };
})();

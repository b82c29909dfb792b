// Compare in-page layout candidates for the HTML viewer on graphs dumped by
// `python bench/bench_viz.py --dump-graphs DIR` (drawable bodies as JSON).
//
//   cd tools/viz_assets && npm ci && npm install --no-save elkjs@0.12.1 @viz-js/viz@3.31.0
//   node --stack-size=65500 compare_engines.mjs DIR/*.json      # writes <name>.<engine>.svg
//
// Prints milliseconds per engine and graph (first layout in a fresh process, so JIT warm-up is
// included, as in a page). Not run by CI: the two other engines are not bundled.
import fs from "fs";
import { createRequire } from "module";
const require = createRequire(import.meta.url);
const dagre = require("@dagrejs/dagre");
const ELK = require("elkjs/lib/elk.bundled.js");
const { instance } = await import("@viz-js/viz");

const width = (t, s) => [...t].reduce((w, c) => w + ("iljtf. ".includes(c) ? 0.35 : /[A-Z]/.test(c) ? 0.72 : 0.6), 0) * s;
const size = (n) => [Math.max(...n[1].map((l) => width(l, 10))) + 20, 13 * n[1].length + 10];
const esc = (t) => String(t).replace(/&/g, "&amp;").replace(/</g, "&lt;");

function draw(nodes, edges, w, h) {   // boxes and polylines: the same picture for every engine
  const out = [`<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" font-family="DejaVu Sans" font-size="10">`];
  for (const pts of edges) out.push(`<polyline fill="none" stroke="#888" points="${pts.map((p) => p.x + "," + p.y).join(" ")}"/>`);
  for (const n of nodes) {
    out.push(`<rect x="${n.x - n.w / 2}" y="${n.y - n.h / 2}" width="${n.w}" height="${n.h}" rx="4" fill="#eef3fb" stroke="#5b7db1"/>`);
    n.lines.forEach((l, k) => out.push(`<text x="${n.x}" y="${n.y - (13 * n.lines.length) / 2 + 10 + 13 * k}" text-anchor="middle">${esc(l)}</text>`));
  }
  out.push("</svg>");
  return out.join("\n");
}

const viz = await instance();
for (const file of process.argv.slice(2)) {
  const g = JSON.parse(fs.readFileSync(file));
  const base = file.replace(/\.json$/, "");
  const ms = {};
  const byId = Object.fromEntries(g.nodes.map((n) => [n[0], n]));

  let t = performance.now();
  const G = new dagre.graphlib.Graph({ multigraph: true });
  G.setGraph({ rankdir: "TB", nodesep: 18, ranksep: 30 });
  G.setDefaultEdgeLabel(() => ({}));
  g.nodes.forEach((n) => { const [w, h] = size(n); G.setNode(n[0], { width: w, height: h }); });
  g.edges.forEach((e, i) => G.setEdge(e[0], e[1], e[2] ? { width: width(e[2], 8), height: 10, labelpos: "r" } : {}, "e" + i));
  dagre.layout(G);
  ms.dagre = performance.now() - t;
  fs.writeFileSync(base + ".dagre.svg", draw(
    g.nodes.map((n) => ({ ...G.node(n[0]), w: G.node(n[0]).width, h: G.node(n[0]).height, lines: n[1] })),
    g.edges.map((e, i) => G.edge(e[0], e[1], "e" + i).points), G.graph().width, G.graph().height));

  t = performance.now();
  const laid = await new ELK().layout({
    id: "root",
    layoutOptions: { "elk.algorithm": "layered", "elk.direction": "DOWN" },
    children: g.nodes.map((n) => { const [w, h] = size(n); return { id: n[0], width: w, height: h }; }),
    edges: g.edges.map((e, i) => ({ id: "e" + i, sources: [e[0]], targets: [e[1]],
      labels: e[2] ? [{ text: e[2], width: width(e[2], 8), height: 10 }] : [] })),
  });
  ms.elk = performance.now() - t;
  fs.writeFileSync(base + ".elk.svg", draw(
    laid.children.map((c) => ({ x: c.x + c.width / 2, y: c.y + c.height / 2, w: c.width, h: c.height, lines: byId[c.id][1] })),
    laid.edges.map((e) => e.sections ? [e.sections[0].startPoint, ...(e.sections[0].bendPoints || []), e.sections[0].endPoint] : []),
    laid.width, laid.height));

  const q = JSON.stringify;
  const dot = "digraph {\nnode [shape=box, fontsize=10];\n" +
    g.nodes.map((n) => `${q(n[0])} [label=${q(n[1].join("\n"))}];`).join("\n") + "\n" +
    g.edges.map((e) => `${q(e[0])} -> ${q(e[1])} [label=${q(e[2])}, fontsize=8];`).join("\n") + "\n}";
  t = performance.now();
  const svg = viz.renderString(dot, { format: "svg" });
  ms["viz-js (dot)"] = performance.now() - t;
  fs.writeFileSync(base + ".vizjs.svg", svg);

  const row = Object.entries(ms).map(([k, v]) => `${k} ${v.toFixed(0)} ms`).join(" · ");
  console.log(`${base.split("/").pop()}: ${g.nodes.length} nodes, ${g.edges.length} edges — ${row}`);
}

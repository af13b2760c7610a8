#include "workers/train/train_page.h"

namespace dray {

const char kTrainPage[] = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>dray train</title>
<link rel="icon" href="data:,">
<style>
  body { font: 15px/1.45 system-ui, sans-serif; max-width: 70em; margin: 2em auto; padding: 0 1em;
         color: #1d2329; }
  h1 { font-size: 1.35em; margin-bottom: .3em; }
  h2 { font-size: 1.05em; margin: 1.6em 0 .5em; }
  progress { width: 32em; max-width: 100%; }
  .charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(20em, 1fr)); gap: 1em; }
  figure { margin: 0; }
  figcaption { color: #56606b; font-size: .9em; }
  svg { width: 100%; height: 11em; background: #f6f8fa; border: 1px solid #d8dee4; }
  svg text { font-size: 10px; fill: #56606b; }
  #sample { max-width: 100%; image-rendering: pixelated; border: 1px solid #d8dee4; }
  pre { background: #f6f8fa; padding: .8em; overflow: auto; max-height: 30em; }
  #error { color: #b3261e; }
</style>
</head>
<body>
<h1>dray train</h1>
<div id="status">waiting for the first step</div>
<progress id="progress" value="0" max="1"></progress>
<div id="error" role="alert"></div>
<h2>Curves</h2>
<div class="charts" id="charts"></div>
<h2>Newest samples</h2>
<figure><img id="sample" alt="no samples yet" hidden><figcaption id="sample-caption">none yet</figcaption></figure>
<h2>Checkpoints</h2>
<ul id="checkpoints"><li>none yet</li></ul>
<details><summary>Configuration</summary><pre id="config"></pre></details>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df"];
// Each chart: its title and the metrics.jsonl keys it draws.
const CHARTS = [
  ["reward", ["reward_mean"]], ["loss", ["loss"]], ["images per second", ["images_per_s"]],
  ["seconds per phase", ["rollout_s", "reward_s", "update_s"]],
];

function svg(tag, attributes) {
  const element = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value);
  return element;
}

// chart draws `keys` of `steps` against the step, one line each.
function chart(title, keys, steps) {
  const series = keys.map((key) => steps.filter((s) => typeof s[key] === "number")
                                         .map((s) => [s.step, s[key]]));
  if (series.every((points) => points.length === 0)) return null;
  const all = series.flat();
  const [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  const [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  const [w, h, pad] = [400, 160, 28];
  const x = (v) => pad + (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5) * (w - 2 * pad);
  const y = (v) => h - pad + (y1 > y0 ? -(v - y0) / (y1 - y0) : -0.5) * (h - 2 * pad);
  const plot = svg("svg", { viewBox: `0 0 ${w} ${h}`, role: "img", "aria-label": title });
  plot.append(svg("line", { x1: pad, y1: h - pad, x2: w - pad, y2: h - pad, stroke: "#afb8c1" }));
  const label = (text, attributes) => Object.assign(svg("text", attributes), { textContent: text });
  plot.append(label(y1.toPrecision(4), { x: 2, y: pad - 4 }), label(y0.toPrecision(4), { x: 2, y: h - pad + 12 }),
              label(`steps ${x0} to ${x1}`, { x: w / 2, y: h - 6, "text-anchor": "middle" }));
  series.forEach((points, i) => {
    const d = points.map(([sx, sy], j) => `${j ? "L" : "M"}${x(sx).toFixed(1)},${y(sy).toFixed(1)}`).join("");
    plot.append(svg("path", { d, fill: "none", stroke: COLORS[i], "stroke-width": 1.6, class: "curve" }));
  });
  const figure = document.createElement("figure");
  const caption = keys.map((key, i) => keys.length > 1 ? `${key} (${["blue", "red", "green"][i]})` : key);
  figure.append(plot, Object.assign(document.createElement("figcaption"),
                                    { textContent: `${title}: ${caption.join(", ")}` }));
  return figure;
}

function show(run) {
  const steps = run.steps;
  const last = steps[steps.length - 1];
  const done = last ? last.step : 0;
  Object.assign($("progress"), { max: run.total_steps, value: done });
  $("status").textContent = last
      ? `step ${done} of ${run.total_steps}` +
        (typeof last.reward_mean === "number" ? `, reward ${last.reward_mean.toFixed(4)}` : "") +
        (typeof last.loss === "number" ? `, loss ${last.loss.toPrecision(4)}` : "") +
        (run.restarts ? `, ${run.restarts} restart(s)` : "")
      : "waiting for the first step";
  $("charts").replaceChildren(...CHARTS.map(([title, keys]) => chart(title, keys, steps)).filter(Boolean));
  const sample = run.samples[run.samples.length - 1];
  if (sample && $("sample").dataset.name !== sample) {
    Object.assign($("sample"), { src: `samples/${sample}`, alt: sample, hidden: false });
    $("sample").dataset.name = sample;
    $("sample-caption").textContent = `${sample}: the input, then the group's outputs with their rewards`;
  }
  $("checkpoints").replaceChildren(...(run.checkpoints.length ? run.checkpoints : ["none yet"])
      .map((name) => Object.assign(document.createElement("li"), { textContent: name })));
  $("config").textContent = run.config;
}

async function refresh() {
  try {
    const response = await fetch("api/run");
    const body = await response.json();
    if (!response.ok) throw body;
    show(body);
    $("error").textContent = "";
  } catch (error) {
    $("error").textContent = `cannot read the run: ${(error.error || error).message || error}`;
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
)html";

}  // namespace dray

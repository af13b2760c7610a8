#include "workers/edit/edit_page.h"

namespace dray {

const char kEditPage[] = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>dray: edit an image</title>
<link rel="icon" href="data:,">
<style>
  body { font: 15px/1.45 system-ui, sans-serif; max-width: 60em; margin: 2em auto; padding: 0 1em;
         color: #1d2329; }
  h1 { font-size: 1.35em; margin-bottom: 1em; }
  form { display: grid; grid-template-columns: 8em minmax(0, 32em); gap: .6em 1em;
         align-items: center; }
  label { text-align: right; color: #56606b; }
  textarea { height: 3.2em; font: inherit; }
  input, textarea { padding: .3em; }
  button { grid-column: 2; justify-self: start; padding: .45em 1.6em; font: inherit; }
  .pictures, #pictures { display: flex; gap: 1em; flex-wrap: wrap; align-items: flex-start; }
  .pictures { margin: 1em 0; }
  .pictures figure { margin: 0; }
  .pictures img { width: 16em; border: 1px solid #c9d1d9; display: block;
                  image-rendering: pixelated; }
  figcaption { color: #56606b; font-size: .9em; }
  progress { width: 32em; max-width: 100%; }
  #error { color: #b3261e; white-space: pre-wrap; }
  [hidden] { display: none !important; }
</style>
</head>
<body>
<h1>dray: edit an image</h1>
<form id="edit">
  <label for="images">Pictures</label>
  <input id="images" type="file" accept="image/png,image/jpeg" multiple required>
  <label for="prompt">Instruction</label>
  <textarea id="prompt" required placeholder="make the sky purple"></textarea>
  <label for="steps">Steps</label>
  <input id="steps" type="number" min="1" max="1000" placeholder="the server's">
  <label for="seed">Seed</label>
  <input id="seed" type="number" min="0" placeholder="a new one each time">
  <label for="token">Token</label>
  <input id="token" type="password" autocomplete="off" placeholder="if the server asks for one">
  <button id="submit" type="submit">Edit</button>
</form>
<p><progress id="progress" value="0" max="1" hidden></progress></p>
<div id="status" role="status"></div>
<div id="error" role="alert"></div>
<div class="pictures"><div id="pictures"></div><div id="result"></div></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let started = 0;  // when the request was sent
$("token").value = localStorage.getItem("dray-token") || "";

function figure(src, caption, id) {
  const img = Object.assign(document.createElement("img"), { src, alt: caption });
  if (id) img.id = id;
  const figure = document.createElement("figure");
  figure.append(img, Object.assign(document.createElement("figcaption"), { textContent: caption }));
  return figure;
}

$("images").addEventListener("change", () => {
  $("pictures").replaceChildren(...[...$("images").files].map(
      (file, i) => figure(URL.createObjectURL(file), `picture ${i + 1}: ${file.name}`)));
});

// readEvents calls onEvent with each server-sent event's data, parsed.
async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    for (let end; (end = buffer.indexOf("\n\n")) >= 0;) {
      const data = buffer.slice(0, end).split("\n").filter((line) => line.startsWith("data: "))
          .map((line) => line.slice(6)).join("\n");
      buffer = buffer.slice(end + 2);
      if (data) onEvent(JSON.parse(data));
    }
  }
}

function onEvent(event) {
  if (event.type === "image_edit.progress") {
    Object.assign($("progress"), { max: event.steps, value: event.step });
    $("status").textContent = `step ${event.step} of ${event.steps}`;
  } else if (event.type === "image_edit.completed") {
    const src = `data:image/png;base64,${event.b64_json}`;
    const caption = `edited: ${event.size}, seed ${event.seed}`;
    const saved = Object.assign(document.createElement("a"),
                                { href: src, download: `edited-${event.seed}.png`, textContent: "save" });
    const result = figure(src, caption, "edited");
    result.querySelector("figcaption").append(" ", saved);
    $("result").replaceChildren(result);
    $("status").textContent = `done in ${((performance.now() - started) / 1000).toFixed(1)} s`;
  } else if (event.type === "error") {
    throw event;
  }
}

function showError(error) {
  const e = error.error || error;
  const known = !e.request_id || String(e.message).includes(e.request_id);
  $("error").textContent = known ? String(e.message || e) : `${e.message}\n(request ${e.request_id})`;
  $("status").textContent = "refused";
}

$("edit").addEventListener("submit", async (submitted) => {
  submitted.preventDefault();
  const form = new FormData();
  for (const file of $("images").files) form.append("image[]", file);
  form.append("prompt", $("prompt").value);
  for (const field of ["steps", "seed"]) if ($(field).value) form.append(field, $(field).value);
  form.append("stream", "true");
  const token = $("token").value;
  localStorage.setItem("dray-token", token);
  $("error").textContent = "";
  $("result").replaceChildren();
  $("status").textContent = "waiting for a worker";
  Object.assign($("progress"), { hidden: false, value: 0 });
  $("submit").disabled = true;
  started = performance.now();
  try {
    const response = await fetch("v1/images/edits", {
      method: "POST", body: form, headers: token ? { Authorization: `Bearer ${token}` } : {},
    });
    if (!response.ok) throw await response.json();
    await readEvents(response.body, onEvent);
  } catch (error) {
    showError(error);
  } finally {
    $("submit").disabled = false;
  }
});
</script>
</body>
</html>
)html";

}  // namespace dray

"use strict";
(function () {
  const data = JSON.parse(document.getElementById("vpe-data").textContent);
  const $ = (id) => document.getElementById(id);
  const MAX_PX = 384;  // the map's longer side, in CSS pixels
  const bytesOf = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const palette = bytesOf(data.colormap);  // (levels + 1) RGB triples
  const inflated = new Map();
  const state = {layer: 0, view: 0, head: 0, frame: 0, query: [0, 0, 0], cursor: null, pinned: false};
  let shown = null;  // what the canvas shows: {row: levels of every key for the query, cell: pixels per patch}
  let queue = Promise.resolve();

  const layer = () => data.layers[state.layer];
  const view = () => layer().views[state.view];
  const map = () => view().maps[state.head];
  const valueOf = (entry, level) => entry.masked && level === data.levels ? -Infinity : entry.lo + level * entry.step;
  const MASKED = "rgb(128,128,128)";  // a key outside the query's field of view (a directional bias)
  const place = (p) => "(" + p.slice(3 - view().grid.length).join(", ") + ")";

  function levelsOf(l, v, m) {  // the map's levels, inflated once, when first shown
    const key = l + "/" + v + "/" + m;
    if (!inflated.has(key)) {
      const stream = new Blob([bytesOf(data.layers[l].views[v].maps[m].data)]).stream()
        .pipeThrough(new DecompressionStream("deflate"));
      inflated.set(key, new Response(stream).arrayBuffer().then((buffer) => new Uint8Array(buffer)));
    }
    return inflated.get(key);
  }

  function rowOf(levels, entry, shape, q) {  // levels of every key (row-major) for the query q = [t, h, w]
    const [T, H, W] = shape, n = T * H * W, row = new Uint8Array(n);
    const qi = (q[0] * H + q[1]) * W + q[2];
    let j = 0;
    for (let t = 0; t < T; t++) for (let h = 0; h < H; h++) for (let w = 0; w < W; w++, j++) {
      row[j] = entry.form === "full" ? levels[qi * n + j]
        : levels[((q[0] - t + T - 1) * (2 * H - 1) + (q[1] - h + H - 1)) * (2 * W - 1) + (q[2] - w + W - 1)];
    }
    return row;
  }

  const colour = (level) => "rgb(" + palette.subarray(3 * level, 3 * level + 3).join(",") + ")";

  function draw(levels) {
    const entry = map(), shape = view().shape, [, H, W] = shape;
    const row = rowOf(levels, entry, shape, state.query);
    const cell = Math.max(2, Math.floor(MAX_PX / Math.max(H, W)));
    const canvas = $("map"), ctx = canvas.getContext("2d");
    canvas.width = W * cell;
    canvas.height = H * cell;
    const first = state.frame * H * W;
    for (let h = 0; h < H; h++) for (let w = 0; w < W; w++) {
      const level = row[first + h * W + w];
      ctx.fillStyle = entry.masked && level === data.levels ? MASKED : colour(level);
      ctx.fillRect(w * cell, h * cell, cell, cell);
    }
    const [qt, qh, qw] = state.query, ring = Math.max(1, Math.min(2, Math.floor(cell / 6)));
    ctx.setLineDash(qt === state.frame ? [] : [3, 3]);
    ctx.lineWidth = ring;
    ctx.strokeStyle = "#e6194b";
    ctx.strokeRect(qw * cell + ring / 2, qh * cell + ring / 2, cell - ring, cell - ring);
    shown = {row: row, cell: cell};
    $("scale").style.height = canvas.height + "px";
    const bar = $("bar").getContext("2d");
    for (let k = 0; k <= data.levels; k++) {
      bar.fillStyle = colour(data.levels - k);
      bar.fillRect(0, k, 1, 1);
    }
    $("hi").textContent = valueOf(entry, entry.masked ? data.levels - 1 : data.levels).toPrecision(4);
    $("lo").textContent = valueOf(entry, 0).toPrecision(4);
    report();
  }

  function report() {
    const entry = map(), [, H, W] = view().shape;
    let text = "query " + place(state.query) + (state.pinned ? " pinned (click to release)" : "");
    if (state.cursor) {
      const c = state.cursor, level = shown.row[(c[0] * H + c[1]) * W + c[2]];
      const value = valueOf(entry, level);
      text += " \u00b7 key " + place(c) + ": " + (value === -Infinity ? "masked (outside the field of view)"
                                                                    : value.toFixed(4));
    }
    $("readout").textContent = text;
    $("quantity").textContent = layer().quantities[state.head] + " \u00b7 " + view().label;
    $("note").textContent = layer().note;
  }

  function render() {
    const l = state.layer, v = state.view, m = state.head;
    queue = queue.then(() => levelsOf(l, v, m)).then(draw)
      .catch((err) => { $("readout").textContent = "cannot show this map: " + err; });
    return queue;
  }

  function fill(select, labels, keep) {
    select.replaceChildren(...labels.map((text, i) => new Option(text, String(i))));
    select.value = String(keep);
    select.disabled = labels.length < 2;
  }

  function moveTo(oldShape) {  // the query (and frame) at the same place of a grid of another shape
    const shape = view().shape;
    const scale = (p, a) => Math.min(shape[a] - 1, Math.floor((p + 0.5) * shape[a] / oldShape[a]));
    state.query = state.query.map(scale);
    state.frame = scale(state.frame, 0);
    state.cursor = null;
    showFrame();
  }

  function showFrame() {  // the frame slider: hidden for image grids
    const T = view().shape[0], slider = $("frame");
    slider.max = String(T - 1);
    slider.value = String(state.frame);
    $("frame-box").hidden = T < 2;
    $("frame-out").textContent = state.frame + " / " + (T - 1);
  }

  function chooseLayer(next, keepView) {
    const old = view().shape;
    state.layer = next;
    state.head = Math.min(state.head, layer().heads.length - 1);
    state.view = keepView < layer().views.length ? keepView : layer().views.length - 1;
    fill($("head"), layer().heads, state.head);
    fill($("view"), layer().views.map((v) => v.label), state.view);
    moveTo(old);
  }

  fill($("layer"), data.layers.map((l) => l.label), 0);
  chooseLayer(0, 0);
  state.query = view().shape.map((s) => Math.floor(s / 2));
  state.frame = state.query[0];
  showFrame();

  $("layer").addEventListener("change", (e) => { chooseLayer(Number(e.target.value), state.view); render(); });
  $("head").addEventListener("change", (e) => { state.head = Number(e.target.value); render(); });
  $("view").addEventListener("change", (e) => {
    const old = view().shape;
    state.view = Number(e.target.value);
    moveTo(old);
    render();
  });
  $("frame").addEventListener("input", (e) => {
    state.frame = Number(e.target.value);
    showFrame();
    render();
  });
  function cellAt(event) {
    const box = $("map").getBoundingClientRect(), [, H, W] = view().shape;
    const clamp = (x, n) => Math.min(n - 1, Math.max(0, Math.floor(x * n)));
    const y = (event.clientY - box.top) / box.height, x = (event.clientX - box.left) / box.width;
    return [state.frame, clamp(y, H), clamp(x, W)];
  }
  $("map").addEventListener("mousemove", (e) => {
    state.cursor = cellAt(e);
    if (!state.pinned) state.query = state.cursor;
    render();
  });
  $("map").addEventListener("click", (e) => {
    state.pinned = !state.pinned;
    state.query = state.cursor = cellAt(e);
    render();
  });

  window.vpeExplorer = {  // for scripted use and the browser tests: what is shown, once drawn
    idle: () => queue,
    state: () => {
      const entry = map(), [, H, W] = view().shape, first = state.frame * H * W;
      const levels = Array.from(shown.row.subarray(first, first + H * W));
      return {layer: state.layer, view: state.view, head: state.head, frame: state.frame, query: state.query.slice(),
              pinned: state.pinned, shape: view().shape.slice(), cell: shown.cell, levels: levels,
              values: levels.map((level) => valueOf(entry, level)), lo: entry.lo, step: entry.step};
    },
  };
  render();
})();

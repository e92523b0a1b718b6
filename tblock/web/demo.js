// The demo page: draws the runs tblock computed (runs.js, or /api/run when served).
// It formats and computes no number: every text comes from the run, and the values it reads
// only choose colours. Classic script, no modules, so the export opens from file://.
(function () {
  "use strict";

  const DEMO = window.TBLOCK_DEMO;
  const controls = DEMO.controls;
  const $ = (id) => document.getElementById(id);
  const PLAY_MS = 450;                                      // one stop per beat while playing

  const view = {
    run: null,          // the run on screen
    event: 0,           // index of the current event
    tapped: null,       // the tapped token, or null: inspect the current event's token
    timer: null,        // the play interval
    tour: -1,           // the tour step on screen, -1 when none
    request: 0,         // the latest run asked for; older answers are dropped
  };

  // ---- colours: a diverging ramp for the stream, sequential ones for weights ----------------

  const NEUTRAL = [244, 241, 234], POSITIVE = [192, 57, 43], NEGATIVE = [33, 102, 172];
  const PROBABILITY = [91, 58, 140], ATTENTION = [22, 128, 118];

  function mix(to, t) {
    const c = NEUTRAL.map((n, i) => Math.round(n + (to[i] - n) * t));
    return "rgb(" + c.join(",") + ")";
  }

  // the square root lifts small entries off the neutral middle: most of a row is well below the scale
  function diverging(value, scale) {
    const t = Math.max(-1, Math.min(1, value / scale));
    return mix(t >= 0 ? POSITIVE : NEGATIVE, Math.sqrt(Math.abs(t)));
  }

  // ---- building the page for a run ---------------------------------------------------------

  function element(tag, className, text) {
    const e = document.createElement(tag);
    if (className) e.className = className;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function buildStage(run) {
    const stage = $("stage");
    stage.replaceChildren();
    stage.style.gridTemplateColumns = "auto repeat(" + run.columns.length + ", auto)";
    stage.appendChild(element("div", "corner", "token \\ stop"));
    run.columns.forEach((c) => {
      const head = element("div", "column-head", c.kind);
      if (c.stage) head.appendChild(element("small", "", c.stage));
      stage.appendChild(head);
    });
    run.tokens.forEach((word, t) => {
      const label = element("div", "row-head", t + " " + word);
      label.dataset.row = t;
      label.addEventListener("click", () => tap(t));
      stage.appendChild(label);
      run.columns.forEach((c, col) => {
        const cell = element("div", "cell");
        cell.dataset.column = col;
        cell.dataset.row = t;
        for (let j = 0; j < c.width; j++) cell.appendChild(element("span", "square"));
        if (c.kind === "predict") cell.appendChild(element("span", "label"));
        stage.appendChild(cell);
      });
    });
  }

  function buildStrip(id, words, onTap) {
    const strip = $(id);
    strip.replaceChildren();
    words.forEach((word, t) => {
      const chip = element("button", "chip");
      chip.type = "button";
      chip.appendChild(element("span", "word", word));
      chip.appendChild(element("span", "weight", ""));
      if (onTap) {
        chip.dataset.tokenIndex = t;
        chip.addEventListener("click", () => { onTap(t); chip.blur(); });
      }
      strip.appendChild(chip);
    });
  }

  function buildCode() {
    const pre = $("code");
    pre.replaceChildren();
    controls.code.forEach((section, s) => {
      pre.appendChild(element("span", "section", "# " + section.file + " · " + section.title));
      section.lines.forEach((text, j) => {
        const line = element("span", "line");
        line.dataset.section = s;
        line.dataset.line = j;
        line.appendChild(element("span", "number", String(section.start + j)));
        line.appendChild(document.createTextNode(text));
        pre.appendChild(line);
      });
    });
  }

  // ---- drawing the current event -----------------------------------------------------------

  // what every cell of the stage holds after events 0..k: the writes replayed in order
  function cellsAt(run, k) {
    const cells = run.columns.map((c) => run.tokens.map(() => ({ values: new Array(c.width).fill(null),
                                                                  texts: new Array(c.width).fill(null),
                                                                  label: null })));
    for (let j = 0; j <= k; j++) {
      const e = run.events[j], cell = cells[e.column][e.token];
      e.values.forEach((v, m) => { cell.values[e.offset + m] = v; cell.texts[e.offset + m] = e.texts[m]; });
      if (e.label !== null) cell.label = e.label;
    }
    return cells;
  }

  // the token's view from its latest event at or before k, or null before its first
  function stateAt(run, token, k) {
    let found = null;
    for (const s of run.states[token]) if (s.from <= k) found = s;
    return found;
  }

  function inspected() {
    return view.tapped !== null ? view.tapped : view.run.events[view.event].token;
  }

  function drawStage(run, k, current) {
    const stage = $("stage");
    stage.dataset.stage = current.kind;
    stage.dataset.event = k;
    const cells = cellsAt(run, k), who = inspected();
    for (const cellEl of stage.querySelectorAll(".cell")) {
      const col = Number(cellEl.dataset.column), t = Number(cellEl.dataset.row);
      const cell = cells[col][t], predict = run.columns[col].kind === "predict";
      const written = cell.values.some((v) => v !== null);
      cellEl.classList.toggle("written", written);
      cellEl.classList.toggle("current", col === current.column && t === current.token);
      cellEl.classList.toggle("inspected", t === who);
      cellEl.querySelectorAll(".square").forEach((sq, m) => {
        const v = cell.values[m];
        sq.style.background = v === null ? "" : (predict ? mix(PROBABILITY, v) : diverging(v, run.scale));
        sq.classList.toggle("faint", v === null);
      });
      cellEl.title = written ? run.columns[col].kind + ", token " + t + ": [" +
                               cell.texts.map((x) => (x === null ? "·" : x)).join(", ") + "]" : "not written yet";
      if (predict) cellEl.querySelector(".label").textContent = cell.label || "";
    }
    for (const label of stage.querySelectorAll(".row-head")) {
      label.classList.toggle("inspected", Number(label.dataset.row) === who);
    }
  }

  function drawStrips(run, state, current) {
    const who = inspected();
    $("sentence").querySelectorAll(".chip").forEach((chip, t) => {
      const w = state && state.attention ? state.attention[t] : null;
      chip.style.background = w === null ? "" : mix(ATTENTION, w);
      chip.querySelector(".weight").textContent = w === null ? "" : state.attention_text[t];
      chip.classList.toggle("inspected", t === who);          // tapped, or else the token being computed
      chip.classList.toggle("tapped", t === view.tapped);
      chip.classList.toggle("current", t === current.token);
    });
    $("vocab").querySelectorAll(".chip").forEach((chip, v) => {
      const p = state && state.probabilities ? state.probabilities[v] : null;
      chip.style.background = p === null ? "" : mix(PROBABILITY, p);
      chip.querySelector(".weight").textContent = p === null ? "" : state.probability_text[v];
      chip.classList.toggle("faint", p === null);
    });
  }

  function drawInspector(run, state, current) {
    const field = (name) => document.querySelector('[data-field="' + name + '"]');
    field("predicts").textContent = state ? state.predicts : "—";
    field("norm").textContent = state ? state.norm : "—";
    field("entropy").textContent = state ? state.entropy : "—";
    field("stage").textContent = current.stage_text;
    const inv = (name) => document.querySelector('[data-invariant="' + name + '"]');
    inv("sum").textContent = state ? state.sum : "Σp: no guess yet";
    inv("unit").textContent = state ? state.unit : "‖row‖ after norm: not normalised yet";
    inv("identical").textContent = "identical tokens: " + current.identical;
  }

  function drawCode(current) {
    const pre = $("code");
    const old = pre.querySelector(".line.current");
    if (old) old.classList.remove("current");
    const line = pre.querySelector('.line[data-section="' + current.line[0] + '"][data-line="' + current.line[1] + '"]');
    line.classList.add("current");
    pre.scrollTop = line.offsetTop - pre.clientHeight / 2;    // the stop's line in the panel's middle
  }

  function render() {
    const run = view.run, k = view.event, current = run.events[k];
    const state = stateAt(run, inspected(), k);
    drawStage(run, k, current);
    drawStrips(run, state, current);
    drawInspector(run, state, current);
    drawCode(current);
    const write = "[" + current.texts.join(", ") + "]";
    $("now").textContent = "event " + k + " of " + run.events.length + " · " + current.caption + " · writes " + write;
    $("play").textContent = view.timer ? "pause" : "play";
  }

  // ---- runs: one per setting of the toggles ------------------------------------------------

  function settings() {
    const t = controls.temperatures[Number($("temperature").value)];
    return { heads: Number($("heads").value), positional: $("positional").checked, temperature: t };
  }

  function keyOf(s) {
    return "h" + s.heads + "-p" + (s.positional ? 1 : 0) + "-t" + s.temperature.text;
  }

  function show(run) {
    const atEnd = view.run !== null && view.event === view.run.events.length - 1;
    const sameShape = view.run !== null && view.run.events.length === run.events.length;
    if (view.run === null) {                                // the strips hold the run's words
      buildStrip("sentence", run.tokens, tap);
      buildStrip("vocab", run.vocab, null);
    }
    view.run = run;
    view.event = atEnd ? run.events.length - 1 : Math.min(view.event, run.events.length - 1);
    if (!sameShape) buildStage(run);
    $("temperature-text").textContent = run.settings.temperature_text;
    document.body.dataset.run = run.key;
    delete document.body.dataset.loading;
    render();
  }

  function loadRun() {
    const s = settings(), request = ++view.request;
    $("temperature-text").textContent = s.temperature.text;
    document.body.dataset.loading = "1";
    if (DEMO.mode === "static") {
      const run = DEMO.runs[keyOf(s)];
      if (!run) return status("this export holds no run " + keyOf(s));
      return show(run);
    }
    const query = "heads=" + s.heads + "&positional=" + (s.positional ? 1 : 0) + "&temperature=" + s.temperature.text;
    fetch("api/run?" + query)
      .then((r) => r.json().then((body) => (r.ok ? body : Promise.reject(new Error(body.error)))))
      .then((run) => { if (request === view.request) show(run); })
      .catch((e) => status("tblock could not run the block: " + e.message));
  }

  function status(text) {
    $("status").textContent = text;
  }

  // ---- moving through the events -------------------------------------------------------------

  function go(k) {
    view.event = Math.max(0, Math.min(view.run.events.length - 1, k));
    render();
  }

  function pause() {
    if (view.timer) clearInterval(view.timer);
    view.timer = null;
  }

  function togglePlay() {
    if (view.timer) { pause(); render(); return; }
    if (view.event === view.run.events.length - 1) view.event = 0;
    view.timer = setInterval(() => {
      if (view.event >= view.run.events.length - 1) { pause(); render(); return; }
      go(view.event + 1);
    }, PLAY_MS);
    render();
  }

  function step(by) { pause(); go(view.event + by); }

  function tap(t) { view.tapped = view.tapped === t ? null : t; render(); }

  function reset() {
    pause();
    closeTour();
    view.tapped = null;
    status("");
    go(0);
  }

  function toggleFullscreen() {
    const refused = (e) => status("fullscreen refused: " + e.message);
    if (document.fullscreenElement) document.exitFullscreen().catch(refused);
    else if (document.documentElement.requestFullscreen) document.documentElement.requestFullscreen().catch(refused);
    else status("this browser has no fullscreen");
  }

  // ---- the guided tour: each step jumps to an event and says what to read there --------------

  function tourStep(i) {
    const steps = view.run.tour;
    if (i >= steps.length) return closeTour();
    pause();
    view.tour = i;
    view.tapped = steps[i].token;
    $("tour").hidden = false;
    $("tour").dataset.step = i;
    $("tour-text").textContent = (i + 1) + "/" + steps.length + " · " + steps[i].text;
    go(steps[i].event);
  }

  function closeTour() {
    view.tour = -1;
    $("tour").hidden = true;
    delete $("tour").dataset.step;
  }

  // ---- wiring --------------------------------------------------------------------------------

  const KEYS = {
    " ": togglePlay, ArrowRight: () => step(1), ArrowLeft: () => step(-1),
    Home: () => { pause(); go(0); }, End: () => { pause(); go(view.run.events.length - 1); },
    r: reset, R: reset, f: toggleFullscreen, F: toggleFullscreen,
    g: () => tourStep(view.tour + 1), G: () => tourStep(view.tour + 1),
  };

  function onKey(e) {
    const t = e.target;
    // a focused slider or menu keeps its own arrow keys
    if (t && (t.tagName === "SELECT" || (t.tagName === "INPUT" && t.type !== "checkbox"))) return;
    if (e.altKey || e.ctrlKey || e.metaKey || !KEYS[e.key] || !view.run) return;
    e.preventDefault();
    KEYS[e.key]();
  }

  function button(id, action) {
    $(id).addEventListener("click", (e) => { action(); e.currentTarget.blur(); });
  }

  function setup() {
    controls.heads.forEach((h) => {
      const o = element("option", "", String(h));
      o.value = h;
      $("heads").appendChild(o);
    });
    $("heads").value = controls.default.heads;
    $("positional").checked = controls.default.positional;
    const slider = $("temperature");
    slider.min = 0;
    slider.max = controls.temperatures.length - 1;
    slider.step = 1;
    slider.value = controls.temperatures.findIndex((t) => t.text === controls.default.temperature_text);
    slider.addEventListener("input", () => { $("temperature-text").textContent = settings().temperature.text; });
    for (const id of ["heads", "positional", "temperature"]) {
      $(id).addEventListener("change", (e) => { e.currentTarget.blur(); loadRun(); });
    }
    button("play", togglePlay);
    button("back", () => step(-1));
    button("next", () => step(1));
    button("reset", reset);
    button("fullscreen", toggleFullscreen);
    button("tour-start", () => tourStep(view.tour + 1));
    button("tour-next", () => tourStep(view.tour + 1));
    button("tour-close", closeTour);
    document.addEventListener("keydown", onKey);
    buildCode();
    document.body.dataset.mode = DEMO.mode;
    loadRun();
  }

  setup();
})();

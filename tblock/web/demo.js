// The demo page: draws the runs tblock computed (runs.js, or /api/run when served).
// It formats and computes no number: every text comes from the run, and the values it reads
// only choose colours. Classic script, no modules, so the export opens from file://.
(function () {
  "use strict";

  const DEMO = window.TBLOCK_DEMO;
  const controls = DEMO.controls;
  const CODE = window.TBLOCK_CODE;
  const $ = (id) => document.getElementById(id);
  const PLAY_MS = 450;                                      // one stop per beat while playing

  const view = {
    run: null,          // the run on screen
    event: 0,           // index of the current event
    tapped: null,       // the tapped token, or null: inspect the current event's token
    timer: null,        // the play interval
    tour: -1,           // the tour step on screen, -1 when none
    request: 0,         // the latest run asked for; older answers are dropped
    said: "",           // what the live region last announced
  };

  // ---- colours: a diverging ramp for the stream, sequential ones for weights ----------------

  const NEUTRAL = [244, 241, 234], POSITIVE = [192, 57, 43], NEGATIVE = [33, 102, 172];
  const PROBABILITY = [91, 58, 140], ATTENTION = [22, 128, 118];

  // WCAG relative luminance: a shaded chip's text is black or white, whichever reads better
  // (one of the two always reaches 4.58:1)
  function luminance(c) {
    const l = c.map((v) => { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2];
  }

  function shade(el, to, t) {
    if (t === null) { el.style.background = ""; el.style.color = ""; return; }
    const bg = to.map((v, i) => Math.round(NEUTRAL[i] + (v - NEUTRAL[i]) * t)), l = luminance(bg);
    el.style.background = "rgb(" + bg.join(",") + ")";
    el.style.color = (l + 0.05) / 0.05 >= 1.05 / (l + 0.05) ? "#000" : "#fff";
  }

  function mix(to, t) {
    return "rgb(" + NEUTRAL.map((n, i) => Math.round(n + (to[i] - n) * t)).join(",") + ")";
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

  // Enter and Space act on a focusable element that is not a native button
  function pressable(el, action) {
    el.tabIndex = 0;
    el.setAttribute("role", "button");
    el.addEventListener("click", action);
    el.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); action(); }
    });
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
      pressable(label, () => tap(t));
      label.setAttribute("aria-label", "inspect token " + t + " " + word);
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
      const chip = element(onTap ? "button" : "span", "chip");
      chip.appendChild(element("span", "word", word));
      chip.appendChild(element("span", "weight", ""));
      if (onTap) {
        chip.type = "button";
        chip.dataset.tokenIndex = t;
        chip.addEventListener("click", () => onTap(t));
      } else {
        chip.tabIndex = 0;                                  // focusable, so its figure can be read
        chip.setAttribute("role", "listitem");
      }
      strip.appendChild(chip);
    });
    if (!onTap) strip.setAttribute("role", "list");
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
      cellEl.classList.toggle("epsilon", !predict && cell.label === "ε");
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
      const mine = Number(label.dataset.row) === who;
      label.classList.toggle("inspected", mine);
      label.setAttribute("aria-pressed", String(Number(label.dataset.row) === view.tapped));
    }
  }

  function drawStrips(run, state, current) {
    const who = inspected();
    $("sentence").querySelectorAll(".chip").forEach((chip, t) => {
      const w = state && state.attention ? state.attention[t] : null;
      shade(chip, ATTENTION, w);
      chip.querySelector(".weight").textContent = w === null ? "" : state.attention_text[t];
      chip.classList.toggle("inspected", t === who);          // tapped, or else the token being computed
      chip.classList.toggle("tapped", t === view.tapped);
      chip.classList.toggle("current", t === current.token);
      chip.setAttribute("aria-pressed", String(t === view.tapped));
    });
    $("vocab").querySelectorAll(".chip").forEach((chip, v) => {
      const p = state && state.probabilities ? state.probabilities[v] : null;
      shade(chip, PROBABILITY, p);
      chip.querySelector(".weight").textContent = p === null ? "" : state.probability_text[v];
      chip.classList.toggle("faint", p === null);
      chip.setAttribute("aria-label", run.vocab[v] + (p === null ? ": no guess yet" : ": p " + state.probability_text[v]));
    });
  }

  function drawInspector(run, state, current) {
    const field = (name) => document.querySelector('[data-field="' + name + '"]');
    const values = { predicts: state ? state.predicts : "—", norm: state ? state.norm : "—",
                     entropy: state ? state.entropy : "—", stage: current.stage_text };
    for (const name in values) field(name).textContent = values[name];
    const inv = (name) => document.querySelector('[data-invariant="' + name + '"]');
    inv("sum").textContent = state ? state.sum : "Σp: no guess yet";
    inv("unit").textContent = state ? state.unit : "‖row‖ after norm: not normalised yet";
    inv("identical").textContent = "identical tokens: " + current.identical;
    // the live region reads the inspector, once a stop is settled (not every beat of playback)
    const who = inspected();
    const said = "token " + who + " " + run.tokens[who] + ": predicts " + values.predicts + ", residual norm " +
                 values.norm + ", attention entropy " + values.entropy + ", stage " + values.stage;
    if (!view.timer && said !== view.said) $("announce").textContent = view.said = said;
  }

  function drawTour() {
    if (view.tour < 0) return;
    const steps = view.run.tour, i = Math.min(view.tour, steps.length - 1);
    $("tour-text").textContent = (i + 1) + "/" + steps.length + " · " + steps[i].text;
  }

  function render() {
    const run = view.run, k = view.event, current = run.events[k];
    const state = stateAt(run, inspected(), k);
    drawStage(run, k, current);
    drawStrips(run, state, current);
    drawInspector(run, state, current);
    drawTour();
    CODE.draw(current);
    const write = "[" + current.texts.join(", ") + "]";
    $("now").textContent = "event " + k + " of " + run.events.length + " · " + current.caption + " · writes " + write;
    $("play").textContent = view.timer ? "pause" : "play";
  }

  // ---- runs: one per setting of the toggles ------------------------------------------------

  function settings() {
    const t = controls.temperatures[Number($("temperature").value)];
    return { heads: Number($("heads").value), positional: $("positional").checked, temperature: t,
             edge: $("constant-row").checked };
  }

  function keyOf(s) {
    return "h" + s.heads + "-p" + (s.positional ? 1 : 0) + "-t" + s.temperature.text;
  }

  // the new run's event at the old one's stop and token (and head, where the new run has it)
  function sameStop(old, run) {
    const cur = old.events[view.event];
    let found = -1;
    run.events.forEach((e, k) => {
      if (e.column === cur.column && e.token === cur.token && (found < 0 || e.head === cur.head)) found = k;
    });
    return found;
  }

  function show(run) {
    if (view.run === null) {                                // the seed's opening: the finished run
      buildStrip("sentence", run.tokens, tap);
      buildStrip("vocab", run.vocab, null);
      buildStage(run);
      view.event = controls.start.event === "last" ? run.events.length - 1 : 0;
      view.tapped = controls.start.token;
    } else {
      view.event = sameStop(view.run, run);
      if (view.run.events.length !== run.events.length) buildStage(run);
    }
    view.run = run;
    $("temperature-text").textContent = run.settings.temperature_text;
    document.body.dataset.run = run.key;
    delete document.body.dataset.loading;
    render();
  }

  function loadRun() {
    const s = settings(), request = ++view.request;
    $("temperature-text").textContent = s.temperature.text;
    document.body.dataset.loading = "1";
    if (s.edge) return show(controls.edge[String(s.heads)]);
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

  // the ε edge runs with the position code off at temperature 1: those controls wait meanwhile
  function toggleEdge() {
    const on = $("constant-row").checked;
    if (on) {
      $("positional").checked = false;
      $("temperature").value = controls.temperatures.findIndex((t) => t.text === "1.00");
    }
    $("positional").disabled = on;
    $("temperature").disabled = on;
    loadRun();
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
    go(steps[i].event);
  }

  // closing leaves the page as a visitor left it before the tour: nothing tapped
  function closeTour() {
    if (view.tour < 0) return;
    view.tour = -1;
    view.tapped = null;
    $("tour").hidden = true;
    delete $("tour").dataset.step;
    render();
  }

  // ---- keys: a focused control keeps its own; the page's act when none claims them ------------

  const KEYS = {
    " ": togglePlay, ArrowRight: () => step(1), ArrowLeft: () => step(-1),
    Home: () => { pause(); go(0); }, End: () => { pause(); go(view.run.events.length - 1); },
    r: reset, R: reset, f: toggleFullscreen, F: toggleFullscreen,
    g: () => tourStep(view.tour + 1), G: () => tourStep(view.tour + 1),
  };
  const ARROWS = ["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown"];
  const PRESS = [" ", "Enter"];

  function claimed(t, key) {
    if (!t || t === document.body || t === document.documentElement) return false;
    const tag = t.tagName, type = (t.type || "").toLowerCase();
    if (tag === "INPUT" && type === "range") return ARROWS.concat(["Home", "End", "PageUp", "PageDown"]).includes(key);
    if (tag === "SELECT") return ARROWS.concat(PRESS, ["Home", "End", "PageUp", "PageDown"]).includes(key);
    if (tag === "INPUT" && type === "radio") return ARROWS.concat(PRESS).includes(key);
    if (tag === "INPUT" && type === "checkbox") return key === " ";
    if (tag === "INPUT" || tag === "TEXTAREA") return true;
    if (tag === "BUTTON" || tag === "SUMMARY" || t.getAttribute("role") === "button") return PRESS.includes(key);
    if (t.id === "code" || t.id === "pseudo") return ARROWS.concat(["Home", "End", "PageUp", "PageDown", " "]).includes(key);
    return false;
  }

  function onKey(e) {
    if (e.altKey || e.ctrlKey || e.metaKey || !KEYS[e.key] || !view.run || claimed(e.target, e.key)) return;
    e.preventDefault();
    KEYS[e.key]();
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
    for (const id of ["heads", "positional", "temperature"]) $(id).addEventListener("change", loadRun);
    $("constant-row").addEventListener("change", toggleEdge);
    $("play").addEventListener("click", togglePlay);
    $("back").addEventListener("click", () => step(-1));
    $("next").addEventListener("click", () => step(1));
    $("reset").addEventListener("click", reset);
    $("fullscreen").addEventListener("click", toggleFullscreen);
    $("tour-start").addEventListener("click", () => tourStep(view.tour + 1));
    $("tour-next").addEventListener("click", () => tourStep(view.tour + 1));
    $("tour-close").addEventListener("click", closeTour);
    document.addEventListener("keydown", onKey);
    CODE.setup(controls, null);
    document.body.dataset.mode = DEMO.mode;
    loadRun();
  }

  setup();
})();

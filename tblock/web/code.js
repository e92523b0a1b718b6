// The demo page's code panel: tblock's own source of the stops, as tblock read it
// (controls.code), with the options (comments, tracer, verbose names), the views (code, both,
// pseudo), hide and the rail, and the values the current stop writes beside its line.
// Display only: every text comes from tblock; nothing here changes the source it shows.
(function () {
  "use strict";

  const $ = (id) => document.getElementById(id);
  const panel = { controls: null, current: null, onLayout: null };

  function element(tag, className, text) {
    const e = document.createElement(tag);
    if (className) e.className = className;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function options() {
    return { comments: $("opt-comments").checked, tracer: $("opt-tracer").checked,
             verbose: $("opt-verbose").checked, view: document.querySelector('input[name="view"]:checked').value };
  }

  // one line as the options show it, or null when they hide it
  function shown(line, o) {
    if (!o.comments && line.doc) return null;
    if (!o.tracer && line.tracer) return null;
    const verbose = o.verbose && line.verbose !== null;
    const text = verbose ? line.verbose : line.text;
    const comment = verbose ? line.verbose_comment : line.comment;
    return !o.comments && comment !== null ? text.slice(0, comment).trimEnd() : text;
  }

  // the stops computed on each line, "section:line" -> [stop]
  function stopsByLine() {
    const by = {};
    panel.controls.stops.forEach((s) => {
      const key = s.line[0] + ":" + s.line[1];
      (by[key] = by[key] || []).push(s);
    });
    return by;
  }

  function narration(stops) {
    const box = element("span", "narration");
    const texts = [];
    stops.forEach((s) => { if (!texts.includes(s.narration)) texts.push(s.narration); });
    box.textContent = "▸ " + stops.map((s) => s.kind + (s.stage ? " (" + s.stage + ")" : "")).join(", ") +
                      ": " + texts.join(" ");
    return box;
  }

  function buildCode(o) {
    const pre = $("code"), by = stopsByLine();
    pre.replaceChildren();
    panel.controls.code.forEach((section, s) => {
      pre.appendChild(element("span", "section", "# " + section.file + " · " + section.title));
      section.lines.forEach((line, j) => {
        const text = shown(line, o);
        if (text === null) return;
        const stops = by[s + ":" + j];
        if (o.view === "both" && stops) pre.appendChild(narration(stops));
        const row = element("span", "line");
        row.dataset.section = s;
        row.dataset.line = j;
        row.appendChild(element("span", "number", String(section.start + j)));
        row.appendChild(element("span", "text", text));
        pre.appendChild(row);
      });
    });
  }

  function buildPseudo() {
    const list = $("pseudo");
    list.replaceChildren();
    panel.controls.stops.forEach((s, column) => {
      const item = element("li", "step");
      item.dataset.column = column;
      item.appendChild(element("code", "pseudo-line", s.pseudo));
      item.appendChild(element("span", "pseudo-stop", s.kind + (s.stage ? " (" + s.stage + ")" : "")));
      item.appendChild(element("p", "narration", s.narration));
      list.appendChild(item);
    });
  }

  function build() {
    const o = options();
    document.body.dataset.codeView = o.view;
    document.body.dataset.codeOptions = ["comments", "tracer", "verbose"].filter((k) => o[k]).join(" ");
    $("code").hidden = o.view === "pseudo";
    $("pseudo").hidden = o.view !== "pseudo";
    if (o.view === "pseudo") buildPseudo();
    else buildCode(o);
    if (panel.current) draw(panel.current);
  }

  function writesOf(event, verbose) {
    const box = element("span", "writes");
    box.setAttribute("aria-label", "values written");
    event.writes.forEach(([name, long, value], k) => {
      if (k) box.appendChild(document.createTextNode(" · "));
      box.appendChild(element("span", "write", (verbose ? long : name) + " = " + value));
    });
    return box;
  }

  // the current stop: its line (or pseudo step) highlighted, its written values beside it, the
  // file bar naming the file that holds it
  function draw(event) {
    panel.current = event;
    const o = options(), c = panel.controls;
    for (const old of document.querySelectorAll("#code-panel .current")) old.classList.remove("current");
    for (const old of document.querySelectorAll("#code-panel .writes")) old.remove();
    const [s, j] = event.line, section = c.code[s];
    $("code-file").textContent = section.name;
    $("code-file").title = section.file + ", lines " + section.start + "–" + section.end;
    $("code-file").setAttribute("aria-label", "file " + section.file);
    $("code-function").textContent = section.title;
    let target, scroller;
    if (o.view === "pseudo") {
      target = $("pseudo").querySelector('.step[data-column="' + event.column + '"]');
      scroller = $("pseudo");
    } else {
      target = $("code").querySelector('.line[data-section="' + s + '"][data-line="' + j + '"]');
      scroller = $("code");
    }
    target.classList.add("current");
    target.appendChild(writesOf(event, o.verbose));
    scroller.scrollTop = target.offsetTop - scroller.clientHeight / 2;    // the stop in the middle
  }

  function setHidden(hidden) {
    document.body.classList.toggle("code-hidden", hidden);
    $("code-panel").hidden = hidden;
    $("code-rail").hidden = !hidden;
    $("code-hide").setAttribute("aria-expanded", String(!hidden));
    (hidden ? $("code-rail") : $("code-hide")).focus();
    if (panel.onLayout) panel.onLayout();
  }

  function setup(controls, onLayout) {
    panel.controls = controls;
    panel.onLayout = onLayout;
    for (const input of document.querySelectorAll("#code-options input, input[name='view']")) {
      input.addEventListener("change", build);
    }
    $("code-hide").addEventListener("click", () => setHidden(true));
    $("code-rail").addEventListener("click", () => setHidden(false));
    build();
  }

  window.TBLOCK_CODE = { setup, draw };
})();

/* Plotly charts, legible at any size of a run: titles are HTML headings outside the plot
   (the mode bar, shown on hover at the top right, cannot cover them), every axis makes
   room for its labels and title (automargin), the legend sits above the plot, and a step
   axis shows at most about ten labels, none rotated, whether a run has 1 step or 200. */
(function () {
  "use strict";
  const D = window.DrCredit;

  const CONFIG = {
    displaylogo: false, responsive: true,
    modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d", "toggleSpikelines",
      "hoverClosestCartesian", "hoverCompareCartesian"],
  };
  // Tall enough for the legend row and, at its right, the mode bar above the plot area.
  const TOP = 44;
  const MAX_TICKS = 10;

  function axis(title, extra) {
    return Object.assign({ automargin: true, tickangle: 0, title: { text: title, standoff: 8 } }, extra || {});
  }

  function layout(extra) {
    return Object.assign({
      margin: { t: TOP, r: 12, b: 8, l: 8, autoexpand: true }, font: { size: 12 },
      legend: { orientation: "h", x: 0, xanchor: "left", y: 1, yanchor: "bottom", yref: "paper" },
    }, extra || {});
  }

  /* 1, 2, 5, 10, 20, 50, ...: the smallest such step giving at most MAX_TICKS ticks over span. */
  function niceStep(span, most) {
    const raw = span / (most || MAX_TICKS);
    if (raw <= 1) return 1;
    const magnitude = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * magnitude >= raw) return m * magnitude;
    return 10 * magnitude;
  }

  /* The x values and axis of a run's steps: a numeric axis with integer ticks (gaps
     between the steps scored stay visible), or, when a group has no step, categories of
     which every k-th is labelled. */
  function stepAxis(steps) {
    if (steps.every((s) => s.step !== null)) {
      const x = steps.map((s) => s.step);
      const lo = Math.min(...x), hi = Math.max(...x), dtick = niceStep(hi - lo);
      // Half a tick of room at each end: the first step's label clears the y axis's.
      const pad = Math.max(0.5, dtick / 2);
      return { x: x, axis: axis("step", { type: "linear", tickmode: "linear", tick0: 0, dtick: dtick,
        range: [lo - pad, hi + pad], tickformat: "d", zeroline: false }) };
    }
    const x = steps.map((s) => (s.step === null ? "none" : String(s.step)));
    const every = Math.ceil(x.length / MAX_TICKS);
    return { x: x, axis: axis("step", { type: "category", tickmode: "array",
      tickvals: x.filter((_, i) => i % every === 0) }) };
  }

  /* A y axis of counts: integer ticks from 0, also when every count is 0. */
  function countAxis(title, values) {
    const most = Math.max(0, ...values.filter((v) => v !== null));
    const extra = { rangemode: "nonnegative", tick0: 0, dtick: niceStep(most, 5), tickformat: "d" };
    if (!most) extra.range = [0, 1];
    return axis(title, extra);
  }

  function plot(id, traces, lay) {
    return Plotly.react(id, traces, layout(lay), CONFIG);
  }

  function evidenceChart(id, series) {
    const traces = [];
    for (const s of series) {
      const x = s.points.map((p) => p.budget);
      traces.push({ x: x, y: s.points.map((p) => p.cumulative), name: "C(b) " + s.name, mode: "lines+markers" });
      traces.push({ x: x, y: s.points.map((p) => p.rate), name: "U(b) " + s.name, mode: "lines+markers",
        line: { dash: "dot" } });
    }
    return plot(id, traces, { xaxis: axis("budget b (research turns)", { dtick: 2 }),
      yaxis: axis("credit (C: gathered, U: per turn)", { rangemode: "tozero" }) });
  }

  Object.assign(D, { charts: { axis: axis, stepAxis: stepAxis, countAxis: countAxis, niceStep: niceStep, plot: plot,
    evidenceChart: evidenceChart, CONFIG: CONFIG } });
})();

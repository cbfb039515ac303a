// Draw every [data-chart] element with uPlot: {x: [unix seconds], series: [{label, colour, values, bars?, dash?,
// outline?}], ylabel, stacked?, days?, legend?}. days: one bar per day, as wide as most of the day, the x axis
// padded half a day each side; outline: a bar drawn as a dashed frame over the others (not stacked);
// legend "static": the labels carry their values, so the legend does not follow the cursor (no "--").
(function () {
  var DAY = 86400;
  function draw(el) {
    if (el.dataset.drawn) return;
    el.dataset.drawn = "1";
    var spec = JSON.parse(el.dataset.chart);
    var values = spec.series.map(function (s) { return s.values.slice(); });
    if (spec.stacked) {
      var running = spec.x.map(function () { return 0; });
      spec.series.forEach(function (s, i) {
        if (!s.bars) return;
        values[i] = values[i].map(function (v, j) { running[j] += v; return running[j]; });
      });
    }
    var bars = uPlot.paths.bars({ size: spec.days ? [0.8, Infinity] : [0.8, 240] });
    var series = [{}].concat(spec.series.map(function (s) {
      var bar = s.bars || s.outline;
      return { label: s.label, stroke: s.colour, width: s.outline ? 2 : (s.bars ? 1 : 2),
               dash: (s.dash || s.outline) ? [6, 4] : undefined,
               fill: s.bars ? s.colour : undefined, paths: bar ? bars : undefined,
               points: { show: !bar && spec.x.length < 60 } };
    }));
    // Stacked bars are drawn from the top of the stack down so each lower cloud covers its share.
    var order = series.slice(1).map(function (_, i) { return i + 1; });
    var data = [spec.x].concat(values);
    var scaleX = { time: true };
    if (spec.days && spec.x.length) {
      scaleX.range = function () { return [spec.x[0] - DAY / 2, spec.x[spec.x.length - 1] + DAY / 2]; };
    }
    var opts = {
      width: Math.min(el.parentElement.clientWidth || 900, 1100) - 20, height: 260,
      series: series, legend: { show: true, live: spec.legend !== "static" },
      axes: [spec.days ? { space: 60, incrs: [DAY], values: "{MMM} {D}" } : {},
             { label: spec.ylabel || "", size: 70 }],
      scales: { x: scaleX },
    };
    if (spec.stacked) {
      var bands = order.filter(function (i) { return spec.series[i - 1].bars; }).reverse();
      var rest = order.filter(function (i) { return !spec.series[i - 1].bars; });
      opts.series = [series[0]].concat(bands.map(function (i) { return series[i]; }),
        rest.map(function (i) { return series[i]; }));
      data = [spec.x].concat(bands.map(function (i) { return values[i - 1]; }),
        rest.map(function (i) { return values[i - 1]; }));
    }
    el.uplot = new uPlot(opts, data, el);  // kept on the element: tests read its scales
  }
  function all() { document.querySelectorAll("[data-chart]").forEach(draw); }
  document.addEventListener("DOMContentLoaded", all);
  document.addEventListener("htmx:afterSwap", all);
})();
// Simulate: a chosen file's text goes into the form's textarea (the form posts text, not multipart).
document.addEventListener("change", function (ev) {
  var input = ev.target;
  if (!input.dataset || !input.dataset.into || !input.files || !input.files[0]) return;
  var target = document.querySelector("textarea[name=" + input.dataset.into + "]");
  input.files[0].text().then(function (text) {
    target.value = text;
    if (input.dataset.into === "trace") document.querySelector("select[name=market]").value = "upload";
  });
});

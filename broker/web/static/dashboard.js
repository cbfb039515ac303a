// Draw every [data-chart] element with uPlot: {x: [unix seconds], series: [{label, colour, values, bars?, dash?}], ylabel, stacked?}
(function () {
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
    var bars = uPlot.paths.bars({ size: [0.8, 240] });
    var series = [{}].concat(spec.series.map(function (s) {
      return { label: s.label, stroke: s.colour, width: s.bars ? 1 : 2, dash: s.dash ? [6, 4] : undefined,
               fill: s.bars ? s.colour : undefined, paths: s.bars ? bars : undefined,
               points: { show: !s.bars && spec.x.length < 60 } };
    }));
    // Stacked bars are drawn from the top of the stack down so each lower cloud covers its share.
    var order = series.slice(1).map(function (_, i) { return i + 1; });
    var data = [spec.x].concat(values);
    var opts = {
      width: Math.min(el.parentElement.clientWidth || 900, 1100) - 20, height: 260,
      series: series, legend: { show: true },
      axes: [{}, { label: spec.ylabel || "", size: 60 }],
      scales: { x: { time: true } },
    };
    if (spec.stacked) {
      var bands = order.filter(function (i) { return spec.series[i - 1].bars; }).reverse();
      opts.series = [series[0]].concat(bands.map(function (i) { return series[i]; }),
        order.filter(function (i) { return !spec.series[i - 1].bars; }).map(function (i) { return series[i]; }));
      data = [spec.x].concat(bands.map(function (i) { return values[i - 1]; }),
        order.filter(function (i) { return !spec.series[i - 1].bars; }).map(function (i) { return values[i - 1]; }));
    }
    new uPlot(opts, data, el);
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

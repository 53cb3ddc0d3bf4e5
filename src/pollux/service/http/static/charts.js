// Small SVG line charts for the Pollux dashboard (no library; written for this page).
// PolluxCharts.line(container, {times, series: [{values, color, step}], yMin, yMax, format})
// draws one chart into `container`, replacing what was there. Null values leave gaps.
"use strict";

const PolluxCharts = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 400, HEIGHT = 130, LEFT = 44, RIGHT = 8, TOP = 8, BOTTOM = 20;

  function node(tag, attrs, text) {
    const element = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) element.setAttribute(key, value);
    if (text !== undefined) element.textContent = text;
    return element;
  }

  function compact(value) {
    const size = Math.abs(value);
    if (size >= 1e6) return (value / 1e6).toPrecision(3) + "M";
    if (size >= 1e3) return (value / 1e3).toPrecision(3) + "k";
    if (size >= 10 || value === 0) return String(Math.round(value * 10) / 10);
    return value.toPrecision(2);
  }

  function clock(seconds) {
    return new Date(seconds * 1000).toTimeString().slice(0, 8);
  }

  function line(container, options) {
    const times = options.times || [];
    const series = options.series || [];
    const format = options.format || compact;
    const svg = node("svg", {class: "chart", viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
                             preserveAspectRatio: "none"});
    const values = series.flatMap(s => s.values.filter(v => v !== null && v !== undefined));
    if (times.length === 0 || values.length === 0) {
      svg.appendChild(node("text", {x: WIDTH / 2, y: HEIGHT / 2, "text-anchor": "middle",
                                    class: "empty"}, "no data yet"));
      container.replaceChildren(svg);
      return svg;
    }
    let low = options.yMin !== undefined ? options.yMin : Math.min(...values);
    let high = options.yMax !== undefined ? options.yMax : Math.max(...values);
    high = Math.max(high, ...values);
    if (high <= low) high = low + 1;
    const start = times[0], end = Math.max(times[times.length - 1], start + 1);
    const x = t => LEFT + (t - start) / (end - start) * (WIDTH - LEFT - RIGHT);
    const y = v => TOP + (1 - (v - low) / (high - low)) * (HEIGHT - TOP - BOTTOM);

    for (const fraction of [0, 0.5, 1]) {
      const value = low + fraction * (high - low);
      svg.appendChild(node("line", {class: "grid", x1: LEFT, x2: WIDTH - RIGHT,
                                    y1: y(value), y2: y(value)}));
      svg.appendChild(node("text", {x: LEFT - 4, y: y(value) + 3, "text-anchor": "end"},
                           format(value)));
    }
    svg.appendChild(node("text", {x: LEFT, y: HEIGHT - 5}, clock(start)));
    svg.appendChild(node("text", {x: WIDTH - RIGHT, y: HEIGHT - 5, "text-anchor": "end"},
                         clock(end)));

    for (const one of series) {
      let path = "", open = false, previous = null;
      one.values.forEach((value, i) => {
        if (value === null || value === undefined) { open = false; return; }
        const px = x(times[i]).toFixed(1), py = y(value).toFixed(1);
        if (!open) path += `M${px},${py}`;
        else if (one.step) path += `H${px}V${py}`;
        else path += `L${px},${py}`;
        open = true;
        previous = py;
      });
      if (!path) continue;
      if (one.step && previous !== null) path += `H${(WIDTH - RIGHT).toFixed(1)}`;
      svg.appendChild(node("path", {class: "line", d: path, stroke: one.color}));
    }
    container.replaceChildren(svg);
    return svg;
  }

  return {line, compact, clock};
})();

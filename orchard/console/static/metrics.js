// /metrics as small charts: sampled in the page, so no server keeps a history for it.
(function () {
  const KEEP = 60, EVERY = 2000;
  const history = {};
  let last = null;

  function parse(text) {
    const sums = {};
    for (const line of text.split("\n")) {
      if (!line || line.startsWith("#")) continue;
      const m = line.match(/^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/);
      if (m) sums[m[1]] = (sums[m[1]] || 0) + Number(m[3]);
    }
    return sums;
  }

  function derive(now, before, seconds) {
    const rate = (name) => before ? Math.max(0, (now[name] || 0) - (before[name] || 0)) / seconds : null;
    const mean = (name) => {
      if (!before) return null;
      const n = (now[name + "_count"] || 0) - (before[name + "_count"] || 0);
      return n > 0 ? ((now[name + "_sum"] || 0) - (before[name + "_sum"] || 0)) / n : null;
    };
    const execMean = mean("orchard_exec_seconds");
    return {
      live: now.orchard_sandboxes_live ?? null,
      inflight: now.orchard_creates_in_flight ?? null,
      creates: rate("orchard_sandbox_creates_total"),
      execs: rate("orchard_execs_total"),
      exec_ms: execMean === null ? null : execMean * 1000,
      create_s: mean("orchard_sandbox_create_seconds"),
      rejected: rate("orchard_admission_rejections_total"),
    };
  }

  function draw(fig, points) {
    const values = points.filter((v) => v !== null);
    const line = fig.querySelector("polyline");
    const max = Math.max(1e-9, ...values);
    line.setAttribute("points", points.map((v, i) =>
      v === null ? "" : `${(i * 120) / (KEEP - 1)},${40 - (v / max) * 36 - 2}`).join(" "));
    const latest = values.length ? values[values.length - 1] : null;
    fig.querySelector(".value").textContent =
      latest === null ? "-" : `${Number(latest.toFixed(2))}${fig.dataset.unit}`;
  }

  async function sample() {
    const status = document.getElementById("metrics-status");
    try {
      const response = await fetch("/metrics", { credentials: "same-origin" });
      if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
      const now = { at: Date.now(), sums: parse(await response.text()) };
      const values = derive(now.sums, last && last.sums, last ? (now.at - last.at) / 1000 : 1);
      last = now;
      for (const fig of document.querySelectorAll("#charts figure")) {
        const key = fig.dataset.series;
        (history[key] = history[key] || []).push(values[key]);
        if (history[key].length > KEEP) history[key].shift();
        draw(fig, history[key]);
      }
      status.textContent = `Last read ${new Date().toLocaleTimeString()}.`;
    } catch (e) {
      status.textContent = `Could not read /metrics: ${e.message}`;
    }
  }
  document.addEventListener("DOMContentLoaded", () => { sample(); setInterval(sample, EVERY); });
})();
